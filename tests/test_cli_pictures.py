"""``ezflow graph``'s pictures (ezflow/_cli/_pictures.py): a definition drawn without
running it (examples/signal_pipeline.py, as a user would), a running graph of the
low-level API drawn from a real graph server with its telemetry, the three formats
(Mermaid, dot rendered by Graphviz when installed, the self-contained HTML/SVG) and
bad options. The running graph of units is drawn in tests/test_cli.py (TICKER)."""

from __future__ import annotations

import asyncio
import re
import shutil
import subprocess
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest
from _proc import ezflow_cli
from typer.testing import CliRunner

import ezflow
from ezflow._cli import _pictures
from ezflow._cli._app import app
from ezflow._cli._inspect import fetch_picture

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
PIPELINE = f"{EXAMPLES / 'signal_pipeline.py'}:graph"
#: The units of examples/signal_pipeline.py, in the order its graph() writes them.
WRITTEN = ["GENERATOR", "BANDPASS", "SPECTRUM", "SINK"]
SVG = "{http://www.w3.org/2000/svg}"


def mermaid_nodes(text: str) -> list[str]:
    """The labels of the nodes a Mermaid flowchart declares, in order (before any
    ``<br/>`` detail)."""
    return re.findall(r'^    n\d+[\[(/]+"([^"<]+)', text, re.MULTILINE)


def mermaid_subgraphs(text: str) -> dict[str, list[str]]:
    """Each subgraph's heading and the node ids it lists."""
    found = re.findall(r'^    subgraph g\d+\["([^"]+)"\]\n(.*?)^    end$', text, re.S | re.M)
    return {heading: body.split() for heading, body in found}


def test_mermaid_of_a_definition_shows_its_units_in_the_order_written() -> None:
    """Acceptance (issue 29): `ezflow graph examples/signal_pipeline.py:graph --mermaid`
    draws the definition without running it: GENERATOR -> BANDPASS -> SPECTRUM -> SINK,
    a cluster per process, each edge with its streams and transport."""
    result = ezflow_cli("graph", PIPELINE, "--mermaid")
    assert result.returncode == 0, result.stderr
    text = result.stdout
    assert text.startswith("flowchart LR\n")
    assert mermaid_nodes(text) == WRITTEN
    assert mermaid_subgraphs(text) == {
        "main process": ["n0", "n3"],
        "process BANDPASS": ["n1"],
        "process SPECTRUM": ["n2"],
    }
    edges = re.findall(r'^    (n\d) -->\|"([^"]*)"\| (n\d)$', text, re.MULTILINE)
    assert edges == [
        ("n0", "OUTPUT → INPUT<br/>shm", "n1"),
        ("n1", "OUTPUT → INPUT<br/>shm", "n2"),
        ("n2", "OUTPUT → INPUT<br/>shm", "n3"),
    ]
    assert "INPUT_SETTINGS" not in text
    assert "<small>SpectrumUnit</small>" in text  # the unit's class under its name
    # Nothing ran: no graph server, no process, nothing printed by the example's sink.
    assert "spectra received" not in result.stdout + result.stderr
    # docs/cli.md shows this very picture (GitHub renders its mermaid block).
    docs = (EXAMPLES.parent / "docs" / "cli.md").read_text()
    (block,) = re.findall(r"^```mermaid\n(.*?)^```$", docs, re.S | re.M)
    assert block == text


def _x(group: ET.Element) -> float:
    """Where a node's box starts, left to right."""
    rect = group.find(f"{SVG}rect")
    assert rect is not None
    return float(rect.get("x", "nan"))


def test_html_of_a_definition_is_self_contained_and_flows_left_to_right(tmp_path: Path) -> None:
    target = tmp_path / "pipeline.html"
    result = ezflow_cli("graph", PIPELINE, "--html", str(target))
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip() == f"wrote {target}"
    page = target.read_text()
    assert page.startswith("<!DOCTYPE html>")
    for remote in ("<script", "src=", "href=", "http://", "https://", "@import"):
        assert remote not in page.replace('xmlns="http://www.w3.org/2000/svg"', "")
    svg = ET.fromstring(page[page.index("<svg") : page.index("</svg>") + len("</svg>")])
    groups = list(svg.iter(f"{SVG}g"))
    units = [g for g in groups if g.get("class") == "node unit"]
    labels = [g.findtext(f"{SVG}title") for g in units]
    assert labels == WRITTEN
    lefts = {g.findtext(f"{SVG}title"): _x(g) for g in units}
    assert lefts["GENERATOR"] < lefts["BANDPASS"] < lefts["SPECTRUM"] < lefts["SINK"]
    clusters = [g.findtext(f"{SVG}text") for g in groups if g.get("class") == "cluster"]
    assert clusters == ["main process", "process BANDPASS", "process SPECTRUM"]
    ports = [c.get("class", "") for c in svg.iter(f"{SVG}circle")]
    assert sorted(ports) == ["port input"] * 3 + ["port output"] * 3  # no INPUT_SETTINGS
    edges = [g.findtext(f"{SVG}title") for g in groups if g.get("class") == "edge"]
    assert edges == [
        "GENERATOR.OUTPUT -> BANDPASS.INPUT (shm)",
        "BANDPASS.OUTPUT -> SPECTRUM.INPUT (shm)",
        "SPECTRUM.OUTPUT -> SINK.INPUT (shm)",
    ]
    assert "not running" in page


def test_dot_of_a_definition_has_ports_and_clusters_and_renders() -> None:
    result = ezflow_cli("graph", PIPELINE, "--dot", "--settings")
    assert result.returncode == 0, result.stderr
    text = result.stdout
    assert "rankdir=LR; newrank=true;" in text
    assert "n0:o_OUTPUT:e -> n1:i_INPUT:w" in text and "n2:o_OUTPUT:e -> n3:i_INPUT:w" in text
    assert text.count("subgraph cluster_") == 3
    assert '<td port="i_INPUT_SETTINGS">INPUT_SETTINGS</td>' in text  # asked for
    if shutil.which("dot") is None:
        pytest.skip("Graphviz is not installed: the dot text is checked, not its rendering")
    rendered = subprocess.run(
        ["dot", "-Tsvg"], input=text, capture_output=True, text=True, timeout=30, check=False
    )
    assert rendered.returncode == 0, rendered.stderr
    assert rendered.stderr == ""  # no warning either
    for unit in WRITTEN:
        assert f">{unit}</text>" in rendered.stdout


def test_a_definition_without_a_format_is_listed() -> None:
    result = CliRunner().invoke(app, ["graph", str(EXAMPLES / "units_quickstart.py") + ":graph"])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert "the definition (not running)" in lines[0]
    assert any(" -> " in line for line in lines[1:])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["graph", PIPELINE, "--json"], "error: --json prints a running graph's view"),
        (["graph", PIPELINE, "--mermaid", "--html", "x.html"], "error: choose one of"),
        (["graph", "no_such_module_here:graph", "--mermaid"], "error: "),
        (["graph", f"{EXAMPLES / 'signal_pipeline.py'}:nothing", "--dot"], "has no attribute"),
    ],
)
def test_bad_options_and_targets_are_one_line_and_exit_2(args: list[str], message: str) -> None:
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert message in result.stderr
    assert "Traceback" not in result.stderr


async def test_a_running_low_level_graph_is_drawn_with_its_rates(
    server: ezflow.GraphServer,
) -> None:
    """Programs of the low-level API: topics are nodes, the program a node, the topic ->
    topic edge between them; the subscriber's edge carries its channel's transport and
    msgs/s once the program reported telemetry."""
    async with ezflow.GraphContext(
        server.address, auto_start=False, name="probe", telemetry_interval=0.05
    ) as ctx:
        pub = await ctx.publisher("/sensor/raw")
        sub = await ctx.subscriber("/filter/in")
        await ctx.connect("/sensor/raw", "/filter/in")
        deadline = time.monotonic() + 15
        while True:
            await pub.publish(np.arange(4.0))
            await asyncio.wait_for(sub.recv(), 10)
            snapshot, telemetry = await fetch_picture(server.address, "test")
            picture = _pictures.from_snapshot(snapshot, telemetry, title="t")
            into = [e for e in picture.edges if picture.node(e.dst).kind == "client"]
            if (into and into[0].rate) or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.05)
    kinds = {node.label: node.kind for node in picture.nodes}
    client = next(label for label, kind in kinds.items() if kind == "client")
    assert client.startswith("probe (pid ")
    assert kinds["/sensor/raw"] == kinds["/filter/in"] == "topic"
    drawn = {(picture.node(e.src).label, picture.node(e.dst).label): e for e in picture.edges}
    assert set(drawn) == {
        (client, "/sensor/raw"),
        ("/sensor/raw", "/filter/in"),
        ("/filter/in", client),
    }
    delivered = drawn["/filter/in", client]
    assert delivered.transport == "local"
    assert delivered.rate is not None and delivered.rate > 0, "no rate within 15 s"
    mermaid = _pictures.mermaid(picture)
    assert '[/"/sensor/raw"/]' in mermaid  # a topic's shape
    assert re.search(r'\|"local · [\d.k]+ msg/s"\|', mermaid)
