"""A video pipeline to trace: CAMERA -> DENOISE -> DISPLAY, each in its own process.

CAMERA publishes 1280x720 RGB frames at 30 fps as ``(seq, frame)`` tuples; DENOISE
averages each frame with the one before and passes it on; DISPLAY counts frames and
prints the rate at the end. Run it with tracing on and look at where each frame's time
goes, hop by hop, from another terminal while it runs (30 s by default):

    ezflow run examples/video_pipeline.py:graph --trace 10
    ezflow trace            # (another terminal)
    ezflow top

    python examples/video_pipeline.py --seconds 2
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import numpy as np

import ezflow


class CameraSettings(ezflow.Settings):
    seconds: float = 30.0
    fps: float = 30.0
    height: int = 720
    width: int = 1280


class Camera(ezflow.Unit):
    SETTINGS: CameraSettings
    OUTPUT = ezflow.OutputStream(tuple)

    @ezflow.publisher(OUTPUT)
    async def capture(self) -> AsyncIterator[tuple[Any, tuple[int, np.ndarray]]]:
        s = self.SETTINGS
        rng = np.random.default_rng(3)
        scene = rng.integers(0, 256, (s.height, s.width, 3), np.uint8)
        frames = max(1, round(s.seconds * s.fps))
        start = time.monotonic()
        for seq in range(frames):
            # A new frame: the scene with a moving bar and a little noise.
            frame = scene.copy()
            frame[:, (seq * 8) % s.width :][:, :16] = 255
            yield self.OUTPUT, (seq, frame)
            await asyncio.sleep(max(0.0, start + (seq + 1) / s.fps - time.monotonic()))


class DenoiseState(ezflow.State):
    previous: np.ndarray | None = None


class Denoise(ezflow.Unit):
    STATE: DenoiseState
    INPUT = ezflow.InputStream(tuple)
    OUTPUT = ezflow.OutputStream(tuple)

    @ezflow.subscriber(INPUT)
    @ezflow.publisher(OUTPUT)
    async def on_frame(
        self, message: tuple[int, np.ndarray]
    ) -> AsyncIterator[tuple[Any, tuple[int, np.ndarray]]]:
        seq, frame = message
        previous = self.STATE.previous
        # Received arrays are read-only: the result is a new array.
        out = frame if previous is None else ((frame.astype(np.uint16) + previous) // 2)
        self.STATE.previous = frame
        yield self.OUTPUT, (seq, out.astype(np.uint8))


class DisplaySettings(ezflow.Settings):
    frames: int = 900


class DisplayState(ezflow.State):
    shown: int = 0
    first: float = 0.0
    last: float = 0.0


class Display(ezflow.Unit):
    SETTINGS: DisplaySettings
    STATE: DisplayState
    INPUT = ezflow.InputStream(tuple)

    @ezflow.subscriber(INPUT)
    def on_frame(self, message: tuple[int, np.ndarray]) -> None:
        state = self.STATE
        state.last = time.monotonic()
        if not state.shown:
            state.first = state.last
        state.shown += 1
        if state.shown == self.SETTINGS.frames:
            raise ezflow.NormalTermination

    def shutdown(self) -> None:
        state = self.STATE
        span = state.last - state.first
        rate = (state.shown - 1) / span if span > 0 else 0.0
        print(f"display: {state.shown} frames, {rate:.1f} fps")


def graph(seconds: float = 30.0, fps: float = 30.0) -> dict[str, Any]:
    """The graph, as the keyword arguments of ezflow.run: what
    `ezflow run examples/video_pipeline.py:graph` runs (*seconds* of video)."""
    camera = Camera(CameraSettings(seconds=seconds, fps=fps))
    denoise = Denoise()
    display = Display(DisplaySettings(frames=max(1, round(seconds * fps))))
    return {
        "components": {"CAMERA": camera, "DENOISE": denoise, "DISPLAY": display},
        "connections": [(camera.OUTPUT, denoise.INPUT), (denoise.OUTPUT, display.INPUT)],
        "process_components": [camera, denoise, display],  # a process each
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0, help="seconds of video")
    args = parser.parse_args()
    ezflow.run(**graph(args.seconds), graph_address="127.0.0.1:0")


if __name__ == "__main__":
    main()
