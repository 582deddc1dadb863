"""Fan-out to a fast consumer and a slow, leaky visualizer.

CAMERA publishes frames at ``fps`` (1000 by default; 0: as fast as the lossless
consumers take them). RECORDER (lossless)
checks that it gets every frame, in order. VIEWER (its own process) takes 20 ms per
frame and subscribes with ``leaky=True, queue=1``: it always shows the newest frame and
drops the rest, so it never slows the camera or the recorder.

    python examples/leaky_visualizer.py --frames 2000
    ezflow run examples/leaky_visualizer.py:graph
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
    frames: int = 2000
    fps: float = 1000.0  # 0: back to back


class Camera(ezflow.Unit):
    SETTINGS: CameraSettings
    OUTPUT = ezflow.OutputStream(np.ndarray)

    @ezflow.publisher(OUTPUT)
    async def capture(self) -> AsyncIterator[tuple[Any, np.ndarray]]:
        period = 1.0 / self.SETTINGS.fps if self.SETTINGS.fps > 0 else 0.0
        start = time.monotonic()
        for index in range(self.SETTINGS.frames):
            if period:  # an absolute schedule, as a camera's clock
                await asyncio.sleep(max(0.0, start + index * period - time.monotonic()))
            frame = np.zeros((64, 64), dtype=np.uint8)
            frame.flat[0] = index % 251  # a cheap frame number the consumers can check
            yield self.OUTPUT, frame


class RecorderState(ezflow.State):
    frames: int = 0
    out_of_order: int = 0
    started: float = 0.0


class Recorder(ezflow.Unit):
    SETTINGS: CameraSettings
    STATE: RecorderState
    INPUT = ezflow.InputStream(np.ndarray)  # lossless: every frame

    def initialize(self) -> None:
        self.STATE.started = time.perf_counter()

    @ezflow.subscriber(INPUT)
    def on_frame(self, frame: np.ndarray) -> None:
        if int(frame.flat[0]) != self.STATE.frames % 251:
            self.STATE.out_of_order += 1
        self.STATE.frames += 1
        if self.STATE.frames == self.SETTINGS.frames:
            raise ezflow.NormalTermination

    def shutdown(self) -> None:
        elapsed = time.perf_counter() - self.STATE.started
        print(
            f"recorder: {self.STATE.frames}/{self.SETTINGS.frames} frames, "
            f"{self.STATE.out_of_order} out of order, in {elapsed:.2f} s"
        )


class ViewerState(ezflow.State):
    shown: int = 0


class Viewer(ezflow.Unit):
    SETTINGS: CameraSettings
    STATE: ViewerState
    INPUT = ezflow.InputStream(np.ndarray, leaky=True, queue=1)  # newest frame only

    @ezflow.subscriber(INPUT)
    def on_frame(self, frame: np.ndarray) -> None:
        time.sleep(0.02)  # a slow renderer (blocking on purpose)
        self.STATE.shown += 1

    def shutdown(self) -> None:
        print(
            f"viewer: showed {self.STATE.shown} of {self.SETTINGS.frames} frames "
            "(dropped the rest, newest first, without slowing anyone)"
        )


def graph(frames: int = 2000, fps: float = 1000.0) -> dict[str, Any]:
    """The graph, as the keyword arguments of ezflow.run: what
    `ezflow run examples/leaky_visualizer.py:graph` runs."""
    settings = CameraSettings(frames=frames, fps=fps)
    camera, recorder, viewer = Camera(settings), Recorder(settings), Viewer(settings)
    return {
        "components": {"CAMERA": camera, "RECORDER": recorder, "VIEWER": viewer},
        "connections": [(camera.OUTPUT, recorder.INPUT), (camera.OUTPUT, viewer.INPUT)],
        "process_components": [viewer],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=2000, help="frames to publish")
    parser.add_argument(
        "--fps", type=float, default=1000.0, help="frames per second (0: back to back)"
    )
    args = parser.parse_args()
    # An embedded graph server on a free port.
    ezflow.run(**graph(args.frames, args.fps), graph_address="127.0.0.1:0")


if __name__ == "__main__":
    main()
