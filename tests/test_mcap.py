"""MCAP recordings (ezflow/_foxglove/_mcap.py, the Recorder/Replayer units, ``ezflow
record``/``replay``): the example pipelines recorded as MCAP, read back by the ``mcap``
library and replayed into a graph; other tools' files; cut and foreign files."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import logging
import os
import signal
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
from _waiting import wait_until
from mcap.reader import make_reader
from mcap.writer import Writer

import ezflow
from ezflow.foxglove import McapReader, McapWriter, summary
from ezflow.units import Recorder, RecorderSettings, Replayer, ReplayerSettings, read_recording

EXAMPLES = Path(__file__).parent.parent / "examples"
ONE_LOOP = pytest.mark.asyncio(loop_factories=["asyncio"])


def _example(name: str) -> ModuleType:
    """examples/NAME.py as a module: the one already imported, whatever its name (its
    message classes are registered once per process), else imported as NAME."""
    path = (EXAMPLES / f"{name}.py").resolve()
    for module in list(sys.modules.values()):
        if getattr(module, "__file__", None) and Path(module.__file__).resolve() == path:
            return module
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


class Collect(ezflow.Unit):
    INPUT = ezflow.InputStream()

    def initialize(self) -> None:
        self.received: list[Any] = []

    @ezflow.subscriber(INPUT)
    def on_message(self, message: Any) -> None:
        self.received.append(message)


def _assert_same(got: Any, want: Any) -> None:
    assert type(got) is type(want), (type(got), type(want))
    if isinstance(want, np.ndarray):
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want)
    elif isinstance(want, tuple):
        assert len(got) == len(want)
        for a, b in zip(got, want, strict=True):
            _assert_same(a, b)
    elif hasattr(want, "__dataclass_fields__"):
        for name in want.__dataclass_fields__:
            _assert_same(getattr(got, name), getattr(want, name))
    else:
        assert got == want


async def _replay(server: ezflow.GraphServer, path: Path, topic: str | None) -> list[Any]:
    replayer = Replayer(ReplayerSettings(path=str(path), rate="max", complete=True, topic=topic))
    collect = Collect()
    async with ezflow.GraphRunner(
        REPLAY=replayer,
        COLLECT=collect,
        connections=[(replayer.OUTPUT, collect.INPUT)],
        graph_address=server.address,
    ) as runner:
        await asyncio.wait_for(runner.wait(), 30)
    return collect.received


# -- the examples, as MCAP ------------------------------------------------------------------

FRAMES, HEIGHT, WIDTH = 12, 24, 32


def _video_frames() -> tuple[list[tuple[int, np.ndarray]], list[tuple[int, np.ndarray]]]:
    """What examples/video_pipeline.py's CAMERA and DENOISE publish (its own logic)."""
    scene = np.random.default_rng(3).integers(0, 256, (HEIGHT, WIDTH, 3), np.uint8)
    camera, denoised, previous = [], [], None
    for seq in range(FRAMES):
        frame = scene.copy()
        frame[:, (seq * 8) % WIDTH :][:, :16] = 255
        camera.append((seq, frame))
        out = frame if previous is None else (frame.astype(np.uint16) + previous) // 2
        denoised.append((seq, out.astype(np.uint8)))
        previous = frame
    return camera, denoised


@ONE_LOOP
async def test_the_video_pipeline_as_mcap(server: ezflow.GraphServer, tmp_path: Path) -> None:
    video = _example("video_pipeline")
    camera = video.Camera(
        video.CameraSettings(seconds=FRAMES / 60, fps=60, height=HEIGHT, width=WIDTH)
    )
    denoise, display = video.Denoise(), video.Display(video.DisplaySettings(frames=FRAMES))
    path = tmp_path / "video.mcap"
    recorder = Recorder(RecorderSettings(path=str(path), format="mcap", topic="/denoised"))
    async with ezflow.GraphRunner(
        CAMERA=camera,
        DENOISE=denoise,
        DISPLAY=display,
        RECORD=recorder,
        connections=[
            (camera.OUTPUT, denoise.INPUT),
            (denoise.OUTPUT, display.INPUT),
            (denoise.OUTPUT, recorder.INPUT),
        ],
        graph_address=server.address,
    ) as runner:
        await asyncio.wait_for(runner.wait(), 30)
    _, denoised = _video_frames()

    # Read back by the mcap library: schema, channel, count, content.
    with path.open("rb") as file:
        reader = make_reader(file)
        found = reader.get_summary()
        assert found is not None and found.statistics is not None
        (channel,) = found.channels.values()
        assert channel.topic == "/denoised" and channel.message_encoding == "json"
        schema = found.schemas[channel.schema_id]
        assert schema.name == "ezflow.Tuple" and schema.encoding == "jsonschema"
        assert found.statistics.message_count == FRAMES
        times = []
        for _, _, message in reader.iter_messages():
            body = json.loads(message.data)
            seq, image = body["items"]
            assert image["dtype"] == "uint8" and image["shape"] == [HEIGHT, WIDTH, 3]
            np.testing.assert_array_equal(
                np.array(image["data"], np.uint8).reshape(HEIGHT, WIDTH, 3), denoised[seq][1]
            )
            times.append(message.log_time)
        assert times == sorted(times) and message.publish_time > 0

    # Replayed by ezflow into a graph: the same messages, in order.
    received = await _replay(server, path, None)
    assert len(received) == FRAMES
    for got, want in zip(received, denoised, strict=True):
        _assert_same(got, want)


@ONE_LOOP
async def test_the_signal_pipeline_as_mcap(server: ezflow.GraphServer, tmp_path: Path) -> None:
    pipeline = _example("signal_pipeline")
    graph = pipeline.graph(duration=1.0)  # 10 blocks
    graph.pop("process_components")  # one process: the test's
    units = graph["components"]
    spectra = tmp_path / "spectra.mcap"
    blocks = tmp_path / "blocks.mcap"
    reference = tmp_path / "spectra.rec"  # ezflow's own format, same messages
    recorders = {
        "REC_SPECTRA": Recorder(RecorderSettings(path=str(spectra), format="mcap")),
        "REC_BLOCKS": Recorder(
            RecorderSettings(path=str(blocks), format="mcap", topic="/bandpass", compression="lz4")
        ),
        "REC_REFERENCE": Recorder(RecorderSettings(path=str(reference))),
    }
    async with ezflow.GraphRunner(
        **units,
        **recorders,
        connections=[
            *graph["connections"],
            (units["SPECTRUM"].OUTPUT, recorders["REC_SPECTRA"].INPUT),
            (units["BANDPASS"].OUTPUT, recorders["REC_BLOCKS"].INPUT),
            (units["SPECTRUM"].OUTPUT, recorders["REC_REFERENCE"].INPUT),
        ],
        graph_address=server.address,
    ) as runner:
        await asyncio.wait_for(runner.wait(), 30)
    want = [message for _, message in read_recording(str(reference))]
    assert len(want) == 10

    seen = summary(str(spectra))
    assert seen["messages"] == 10
    assert seen["topics"] == {
        "REC_SPECTRA/INPUT": {
            "messages": 10,
            "schema": "examples.signal_pipeline.Spectrum",
            "encoding": "json",
        }
    }
    with spectra.open("rb") as file:
        reader = make_reader(file)
        schema = next(iter(reader.get_summary().schemas.values()))  # type: ignore[union-attr]
        properties = json.loads(schema.data)["properties"]
        assert properties["peak_hz"] == {"type": "number"}
        for (_, _, message), spectrum in zip(reader.iter_messages(), want, strict=True):
            body = json.loads(message.data)
            assert body["peak_hz"] == spectrum.peak_hz
            np.testing.assert_array_equal(body["magnitudes"]["data"], spectrum.magnitudes)
    assert summary(str(blocks))["topics"]["/bandpass"]["schema"] == "ezflow.Array"

    received = await _replay(server, spectra, "REC_SPECTRA/INPUT")
    assert len(received) == len(want)
    for got, spectrum in zip(received, want, strict=True):
        assert isinstance(got, pipeline.Spectrum)
        _assert_same(got, spectrum)


# -- other tools' files, cut files, files that are not MCAP --------------------------------


def _foreign(path: Path) -> None:
    """An MCAP file as another tool writes it: JSON, raw bytes and ROS 1 channels."""
    with path.open("wb") as file:
        writer = Writer(file)
        writer.start(profile="", library="another tool")
        pose = writer.register_schema(
            "foreign.Pose", "jsonschema", json.dumps({"type": "object"}).encode()
        )
        ros = writer.register_schema("std_msgs/String", "ros1msg", b"string data")
        channels = {
            "json": writer.register_channel("/pose", "json", pose),
            "raw": writer.register_channel("/blob", "", 0),
            "ros": writer.register_channel("/chatter", "ros1", ros),
        }
        for i in range(3):
            stamp = 1_000_000_000 + i * 1000
            writer.add_message(
                channels["json"], stamp, json.dumps({"x": i, "y": [i, 0.5]}).encode(), stamp
            )
            writer.add_message(channels["raw"], stamp + 1, bytes([i]) * 4, stamp + 1)
            writer.add_message(channels["ros"], stamp + 2, b"\x05\x00\x00\x00hello", stamp + 2)
        writer.finish()


def test_other_tools_json_and_raw_channels_are_read_others_skipped_and_counted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "foreign.mcap"
    _foreign(path)
    reader = McapReader(str(path))
    with caplog.at_level(logging.WARNING, "ezflow.foxglove"):
        records = list(reader)
    assert [(r.topic, r.message) for r in records] == [
        (topic, message)
        for i in range(3)
        for topic, message in (("/pose", {"x": i, "y": [i, 0.5]}), ("/blob", bytes([i]) * 4))
    ]
    assert reader.skipped == {"/chatter": 3}
    assert reader.skipped_encodings == {"/chatter": "ros1"}
    warnings = [r.getMessage() for r in caplog.records if "/chatter" in r.getMessage()]
    assert len(warnings) == 1 and "'ros1'" in warnings[0], warnings


def test_a_cut_file_gives_what_it_holds_then_says_it_was_cut(tmp_path: Path) -> None:
    path = tmp_path / "whole.mcap"
    with McapWriter(str(path), chunk_size=2048) as writer:
        for i in range(200):
            writer.write("/n", np.arange(8) + i, log_time=1000 + i)
    data = path.read_bytes()
    cut = tmp_path / "cut.mcap"
    cut.write_bytes(data[: len(data) // 2])
    got: list[int] = []
    with pytest.raises(ezflow.ProtocolError, match=rf"{cut} was cut or is damaged after \d+"):
        for record in McapReader(str(cut)):
            got.append(int(record.message[0]))
    assert 0 < len(got) < 200 and got == list(range(len(got)))
    with pytest.raises(ezflow.ProtocolError, match=rf"{cut} has no MCAP summary"):
        summary(str(cut))


def test_a_file_that_is_not_mcap_is_named(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_bytes(b"hello, not a recording")
    with pytest.raises(ezflow.ProtocolError, match=rf"{path} is not an MCAP file"):
        list(McapReader(str(path)))
    path.write_bytes(b"\x89MCAP0\r\n" + b"\xff" * 40)  # the magic, then garbage
    with pytest.raises(ezflow.ProtocolError, match=rf"{path} was cut or is damaged after 0"):
        list(McapReader(str(path)))


def test_recorder_settings_are_checked() -> None:
    with pytest.raises(ezflow.ConfigurationError, match="format='csv'"):
        RecorderSettings(path="x", format="csv")  # type: ignore[arg-type]
    with pytest.raises(ezflow.ConfigurationError, match="compression='gzip'"):
        RecorderSettings(path="x", format="mcap", compression="gzip")  # type: ignore[arg-type]


# -- the commands -------------------------------------------------------------------------


async def _cli(*args: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "ezflow",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
    )


@ONE_LOOP
async def test_a_recording_killed_halfway_is_read_up_to_the_cut(
    ctx: ezflow.GraphContext, server: ezflow.GraphServer, tmp_path: Path
) -> None:
    path = tmp_path / "killed.mcap"
    address = f"{server.address[0]}:{server.address[1]}"
    publisher = await ctx.publisher("/ticks")
    recorder = await _cli("record", str(path), "/ticks", "--format", "mcap", "--address", address)
    try:
        assert recorder.stdout is not None
        line = await asyncio.wait_for(recorder.stdout.readline(), 30)
        assert line.startswith(b"recording /ticks"), line
        await publisher.wait_for_channels(1)
        sent = 0

        async def publish_while_recording() -> None:
            nonlocal sent
            while True:
                await publisher.publish(np.full(64, sent, np.int64))
                sent += 1
                await asyncio.sleep(0.005)

        publishing = asyncio.create_task(publish_while_recording())
        # A chunk is finished at least every MCAP_FLUSH_INTERVAL (1 s): wait for one.
        await wait_until(lambda: path.stat().st_size > 4096, "a chunk on disk", timeout=20)
        recorder.send_signal(signal.SIGKILL)
        await recorder.wait()
        publishing.cancel()
        await asyncio.gather(publishing, return_exceptions=True)
    finally:
        if recorder.returncode is None:
            recorder.kill()
            await recorder.wait()
    got: list[int] = []
    with pytest.raises(ezflow.ProtocolError, match=rf"{path} was cut or is damaged after"):
        for record in McapReader(str(path)):
            got.append(int(record.message[0]))
    assert got and got == list(range(got[0], got[0] + len(got))), got[:5]
    assert len(got) <= sent  # (a kill right after a chunk loses nothing)


@ONE_LOOP
async def test_ezflow_replay_publishes_an_mcap_file_on_its_topics(
    ctx: ezflow.GraphContext, server: ezflow.GraphServer, tmp_path: Path
) -> None:
    path = tmp_path / "two.mcap"
    with McapWriter(str(path)) as writer:
        for i in range(20):
            writer.write("/a", np.arange(4) + i, log_time=1000 + 2 * i)
            writer.write("/b", {"i": i}, log_time=1001 + 2 * i)
    sub_a = await ctx.subscriber("/a")
    sub_b = await ctx.subscriber("/b")
    address = f"{server.address[0]}:{server.address[1]}"
    process = await _cli("replay", str(path), "--rate", "max", "--address", address)
    out, err = await asyncio.wait_for(process.communicate(), 30)
    assert process.returncode == 0, err
    assert b"replayed 40 messages" in out, out
    a = [int((await asyncio.wait_for(sub_a.recv(), 10))[0]) for _ in range(20)]
    b = [(await asyncio.wait_for(sub_b.recv(), 10))["i"] for _ in range(20)]
    assert a == list(range(20)) and b == list(range(20))


@ONE_LOOP
async def test_ezflow_replay_of_a_file_that_is_no_recording_names_it(
    server: ezflow.GraphServer, tmp_path: Path
) -> None:
    """Any file: it is named as no recording (before --to is asked for), exit 2."""
    path = tmp_path / "notes.txt"
    path.write_text("root:x:0:0:root:/root:/bin/bash\n")
    address = f"{server.address[0]}:{server.address[1]}"
    for extra in ([], ["--to", "/t"]):
        process = await _cli("replay", str(path), "--address", address, *extra)
        out, err = await asyncio.wait_for(process.communicate(), 30)
        assert process.returncode == 2, (out, err)
        assert err.decode().strip() == (
            f"error: {path} is not an ezflow recording (header 114); ezflow replay reads "
            "MCAP files, ezflow recordings and ezmsg logs"
        )
