"""Apicurio Registry's runnable distribution, fetched once from Maven Central.

Apicurio publishes its built Quarkus application next to the thin jar, as the `all`
classifier of `io.apicurio:apicurio-registry-app` (a tar.gz: a runner jar and lib/), so
no Quarkus build is needed: `mvn dependency:unpack` puts it in
~/.cache/tidebatch/apicurio-<version>/dist ($TIDEBATCH_APICURIO_HOME overrides the
folder), and `java -jar <runner>` starts a registry with in-memory storage (H2).
scripts/ensure_registry.sh calls this before pytest; tests/integration/schema_registry.py
starts the processes. docs/SCHEMA_REGISTRY.md has the figures.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

from consumers.brokers.kafka_fetch import DEPENDENCY_PLUGIN, maven_error_line

# The pin. 2.6.x runs on Java 17, the Java Apache Kafka's jars already need
# (scripts/ensure_kafka.sh); 3.x is compiled for Java 21 and fails on 17 with
# UnsupportedClassVersionError (class file version 65.0). TIDEBATCH_APICURIO_VERSION=3.3.3
# with TIDEBATCH_APICURIO_JAVA=<a Java 21+> runs a 3.x instead: both layouts are found.
APICURIO_VERSION = "2.6.13.Final"
VERSION_ENV = "TIDEBATCH_APICURIO_VERSION"
HOME_ENV = "TIDEBATCH_APICURIO_HOME"
JAVA_ENV = "TIDEBATCH_APICURIO_JAVA"
ARTIFACT = "io.apicurio:apicurio-registry-app:{version}:tar.gz:all"
_MARKER = ".complete"


class RegistryDistError(RuntimeError):
    """Apicurio Registry cannot be fetched or found."""


def pinned_version() -> str:
    return os.environ.get(VERSION_ENV) or APICURIO_VERSION


def apicurio_home(version: str) -> Path:
    """Folder holding dist/ for `version`: $TIDEBATCH_APICURIO_HOME, else the user cache."""
    if os.environ.get(HOME_ENV):
        return Path(os.environ[HOME_ENV]).expanduser()
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "tidebatch" / f"apicurio-{version}"


def java_binary() -> str:
    """$TIDEBATCH_APICURIO_JAVA, else `java` on PATH."""
    java = os.environ.get(JAVA_ENV) or shutil.which("java")
    if not java:
        raise RegistryDistError("java not found on PATH: Apicurio Registry 2.6 needs Java 17 or newer")
    return java


def runner_jar(dist: Path) -> Path:
    """The jar `java -jar` starts: quarkus-run.jar (3.x, fast-jar) or *-runner.jar (2.x,
    legacy-jar with lib/ beside it)."""
    fast = dist / "quarkus-run.jar"
    if fast.is_file():
        return fast
    legacy = sorted(dist.glob("*-runner.jar"))
    if legacy:
        return legacy[0]
    raise RegistryDistError(f"no quarkus-run.jar or *-runner.jar in {dist}")


def cds_archive(home: Path) -> Path:
    """The class-data archive a training run leaves (schema_registry.py): with it the JVM
    maps the classes of a previous start instead of loading them (6 s -> 2.6 s here)."""
    return home / "app-cds.jsa"


def ensure_dist(version: str, home: Path | None = None, *, mvn_args: Sequence[str] = ()) -> Path:
    """The dist/ folder of Apicurio Registry `version`, unpacked with Maven the first
    time. Idempotent; under a file lock, so racing processes fetch once."""
    home = home or apicurio_home(version)
    dist = home / "dist"
    if (home / _MARKER).is_file() and dist.is_dir():
        return dist
    mvn = shutil.which("mvn")
    if mvn is None:
        raise RegistryDistError("mvn not found on PATH: Apicurio Registry is fetched with Maven (apt-get install maven)")
    home.mkdir(parents=True, exist_ok=True)
    with open(home / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (home / _MARKER).is_file() and dist.is_dir():
            return dist
        # Run in the staging folder: without a project, unpack writes its markers under
        # "./${project.basedir}/target", and a stale marker there would skip the unpack.
        staging = Path(tempfile.mkdtemp(prefix="dist-", dir=home))
        cmd = [
            mvn, "-B", "-q", "-Dstyle.color=never",
            f"{DEPENDENCY_PLUGIN}:unpack",
            f"-Dartifact={ARTIFACT.format(version=version)}",
            f"-DoutputDirectory={staging / 'dist'}",
            *mvn_args,
        ]
        proc = subprocess.run(cmd, cwd=staging, capture_output=True, text=True, stdin=subprocess.DEVNULL)
        try:
            jar = runner_jar(staging / "dist") if proc.returncode == 0 else None
        except RegistryDistError:
            jar = None
        if jar is None:
            shutil.rmtree(staging, ignore_errors=True)
            raise RegistryDistError(
                f"cannot fetch Apicurio Registry {version} with Maven: {maven_error_line(proc.stdout + proc.stderr)}"
            )
        shutil.rmtree(dist, ignore_errors=True)  # a half-unpacked folder from a killed run
        (staging / "dist").rename(dist)
        shutil.rmtree(staging, ignore_errors=True)
        cds_archive(home).unlink(missing_ok=True)  # made by another version's classes
        (home / _MARKER).write_text(f"apicurio-registry-app {version}\n{jar.name}\n")
    return dist
