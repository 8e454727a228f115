"""Apache Kafka's server jars: fetched once from Maven Central with `mvn
dependency:copy-dependencies` (consumers/brokers/kafka_jars/pom.xml) into
~/.cache/tidebatch/kafka-<version>/libs, or $TIDEBATCH_KAFKA_HOME/libs, for
KafkaBroker (consumers/brokers/kafka.py) to run.

    python -m consumers.brokers.kafka fetch      # scripts/ensure_kafka.sh
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

from consumers.brokers.embedded import BrokerError

# The pin. docker-compose.yml runs apache/kafka:<this> (checked by a unit test), so the
# tests and the compose stack run the same broker.
KAFKA_VERSION = "4.0.0"
POM = Path(__file__).resolve().parent / "kafka_jars" / "pom.xml"
# Full coordinates: Maven 3.8's default for the `dependency:` prefix is 2.8 (2014), and
# resolving a prefix needs remote metadata even when the plugin is already cached.
DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1"
HOME_ENV = "TIDEBATCH_KAFKA_HOME"
_MARKER = ".complete"


class KafkaBrokerError(BrokerError):
    """Apache Kafka cannot be fetched, started, or used."""


def kafka_home(version: str = KAFKA_VERSION) -> Path:
    """Folder holding libs/ for `version`: $TIDEBATCH_KAFKA_HOME, else the user cache."""
    if os.environ.get(HOME_ENV):
        return Path(os.environ[HOME_ENV]).expanduser()
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "tidebatch" / f"kafka-{version}"


def _require(tool: str, hint: str) -> str:
    path = shutil.which(tool)
    if path is None:
        raise KafkaBrokerError(f"{tool} not found on PATH: {hint}")
    return path


def require_java() -> str:
    return _require("java", "Apache Kafka needs Java 17 or newer (apt-get install openjdk-17-jre-headless)")


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def maven_error_line(output: str) -> str:
    """mvn's own last telling error line, without its boilerplate ("-> [Help 1]", ...)."""
    boilerplate = ("[Help", "-e switch", "-X switch", "full stack trace", "For more information", "Re-run Maven")
    lines = []
    for raw in _ANSI.sub("", output).splitlines():
        line = raw.strip()
        if not line.startswith("[ERROR]"):
            continue
        line = line.removeprefix("[ERROR]").strip().removesuffix("-> [Help 1]").strip()
        if line and not line.startswith("[Help") and not any(b in line for b in boilerplate):
            lines.append(line)
    if lines:
        return lines[-1]
    rest = [line.strip() for line in output.splitlines() if line.strip()]
    return rest[-1] if rest else "(no output)"


def ensure_jars(
    version: str = KAFKA_VERSION,
    home: Path | None = None,
    *,
    mvn_args: Sequence[str] = (),
) -> Path:
    """The libs/ folder with Apache Kafka `version`'s server jars; fetched with Maven the
    first time. Idempotent, and safe when processes race: one fetches under a file lock,
    the others wait and then find the marker. mvn_args: extra mvn flags (tests point
    them at an unreachable mirror)."""
    home = home or kafka_home(version)
    libs = home / "libs"
    if (home / _MARKER).is_file() and libs.is_dir():
        return libs
    mvn = _require("mvn", "Apache Kafka's jars are fetched with Maven (apt-get install maven)")
    home.mkdir(parents=True, exist_ok=True)
    with open(home / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (home / _MARKER).is_file() and libs.is_dir():
            return libs  # another process fetched them while we waited
        staging = Path(tempfile.mkdtemp(prefix="libs-", dir=home))
        cmd = [
            mvn, "-B", "-q", "-Dstyle.color=never", "-f", str(POM),
            f"{DEPENDENCY_PLUGIN}:copy-dependencies",
            f"-Dkafka.version={version}",
            f"-DoutputDirectory={staging}",
            "-DincludeScope=runtime",
            *mvn_args,
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL)
        jars = sorted(p.name for p in staging.glob("*.jar"))
        if proc.returncode != 0 or not any(j.startswith(f"kafka_2.13-{version}") for j in jars):
            shutil.rmtree(staging, ignore_errors=True)
            raise KafkaBrokerError(
                f"cannot fetch Apache Kafka {version} with Maven: "
                f"{maven_error_line(proc.stdout + proc.stderr)}"
            )
        shutil.rmtree(libs, ignore_errors=True)  # a half-fetched folder from a killed run
        staging.rename(libs)
        (home / _MARKER).write_text(f"kafka {version}\n" + "".join(f"{j}\n" for j in jars))
    return libs


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m consumers.brokers.kafka fetch`: fetch the pinned jars, print where they are
    (scripts/ensure_kafka.sh). One line on failure, exit 1."""
    import argparse
    import sys

    parser = argparse.ArgumentParser(prog="python -m consumers.brokers.kafka")
    parser.add_argument("action", choices=["fetch"])
    parser.parse_args(argv)
    try:
        require_java()
        libs = ensure_jars()
    except KafkaBrokerError as exc:
        print(f"kafka: error: {exc}", file=sys.stderr)
        return 1
    print(f"kafka: Apache Kafka {KAFKA_VERSION} jars in {libs}")
    return 0
