"""The house's layers (docs/ARCHITECTURE.md "Layers"): every import points down or
sideways, never up, and no module imports itself back through others (type-only imports
and imports inside functions included)."""

from __future__ import annotations

from pathlib import Path

from tests.unit.import_graph import cycles, edges, modules

REPO = Path(__file__).resolve().parents[2]

# Lowest first. A module may import from its own layer and those below it. A new folder
# (or a module directly in pipeline/) gets its row here: the test names any that has none.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("base", ("pipeline.errors", "pipeline.clock", "pipeline.extras", "pipeline.completion")),
    ("Kafka I/O, model builds, the batching core",
     ("consumers", "models", "pipeline.batching")),
    ("parts without configuration",
     ("consumers.brokers", "pipeline.observe", "pipeline.runtime", "pipeline.simulate",
      "pipeline.simulate_tenants", "pipeline.loadgen")),
    ("codecs", ("pipeline.codecs",)),
    ("the pipeline registry", ("pipeline.registry",)),
    ("around the model", ("pipeline.hooks", "pipeline.scoring", "pipeline.sinks", "pipeline.redisio",
                          "pipeline.ops")),
    ("configuration", ("pipeline.config",)),
    ("services", ("pipeline.versions", "pipeline.kafka_backend", "pipeline.delivery", "pipeline.etl")),
    ("workers", ("pipeline.worker", "pipeline.generation", "pipeline.faust", "pipeline.dlq")),
    ("composition root", ("pipeline.app",)),
    ("tools", ("pipeline.profiling",)),
    ("command line", ("pipeline.commands",)),
    ("entry point", ("pipeline.cli", "pipeline")),
)


def layer_of(module: str) -> int | None:
    """The layer of the longest table entry that is the module or one of its packages."""
    best: tuple[int, int] | None = None  # (entry length, layer)
    for number, (_, units) in enumerate(LAYERS):
        for unit in units:
            inside = module == unit or module.startswith(unit + ".")
            if inside and (best is None or len(unit) > best[0]):
                best = (len(unit), number)
    return None if best is None else best[1]


def test_every_module_has_a_layer() -> None:
    missing = sorted(m for m in modules(REPO) if layer_of(m) is None)
    assert not missing, f"place these in LAYERS (tests/unit/test_layers.py): {missing}"


def test_no_import_points_up_a_layer() -> None:
    up = []
    for module, targets in sorted(edges(REPO).items()):
        here = layer_of(module)
        for target in sorted(targets):
            there = layer_of(target)
            if here is not None and there is not None and there > here:
                up.append(f"{module} ({LAYERS[here][0]}) -> {target} ({LAYERS[there][0]})")
    assert not up, "imports pointing up a layer:\n" + "\n".join(up)


def test_no_import_cycles() -> None:
    assert cycles(edges(REPO)) == []


def test_the_cycle_finder_finds_a_type_only_cycle(tmp_path: Path) -> None:
    """The finder itself: a cycle closed by a TYPE_CHECKING import is a cycle."""
    package = tmp_path / "pipeline"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from pipeline.b import B\n")
    (package / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pipeline.a import A\nclass B: ...\n"
    )
    (package / "c.py").write_text("def f():\n    from pipeline import a\n")
    graph = edges(tmp_path)
    assert graph["pipeline.c"] == {"pipeline.a"}
    assert cycles(graph) == [["pipeline.a", "pipeline.b"]]


def test_pipeline_holds_at_most_twelve_modules_directly() -> None:
    """Everything else lives in a folder named for what it holds."""
    flat = sorted(p.name for p in (REPO / "pipeline").glob("*.py"))
    assert len(flat) <= 12, flat
