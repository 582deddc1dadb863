"""ezmsg's toy example, rewritten for ezflow's tests with the same structure (faster
timings, and a @main that ends the graph): generators, an oscillator, a collection
joining messages with its latest value, debug outputs, a blocking @main. Only the import
line differs from the ezmsg program (tests/test_ezmsg.py runs it under both)."""

import asyncio
import math
import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass

import ezflow.compat.ezmsg as ez


@dataclass
class CombinedMessage:
    string: str
    number: float


class LFOSettings(ez.Settings):
    freq: float = 0.2
    update_rate: float = 20.0


class LFO(ez.Unit):
    SETTINGS = LFOSettings
    OUTPUT = ez.OutputStream(float)

    async def initialize(self) -> None:
        self.start_time = time.time()

    @ez.publisher(OUTPUT)
    async def generate(self) -> AsyncGenerator:
        while True:
            elapsed = time.time() - self.start_time
            yield self.OUTPUT, math.sin(2.0 * math.pi * self.SETTINGS.freq * elapsed)
            await asyncio.sleep(1.0 / self.SETTINGS.update_rate)


class MessageGeneratorSettings(ez.Settings):
    message: str


class MessageGenerator(ez.Unit):
    SETTINGS = MessageGeneratorSettings
    OUTPUT = ez.OutputStream(str)

    @ez.publisher(OUTPUT)
    async def spawn_message(self) -> AsyncGenerator:
        while True:
            await asyncio.sleep(0.2)
            ez.logger.info(f"Spawning {self.SETTINGS.message}")
            yield self.OUTPUT, self.SETTINGS.message

    @ez.publisher(OUTPUT)
    async def spawn_once(self) -> AsyncGenerator:
        yield self.OUTPUT, "Spawned Once"
        raise ez.Complete


class DebugOutputSettings(ez.Settings):
    name: str | None = "Default"


class DebugOutput(ez.Unit):
    SETTINGS = DebugOutputSettings
    INPUT = ez.InputStream(str)

    @ez.subscriber(INPUT)
    async def on_message(self, message: str) -> None:
        ez.logger.info(f"Output[{self.SETTINGS.name}]: {message}")


class MessageModifierState(ez.State):
    number: float


class MessageModifier(ez.Unit):
    STATE = MessageModifierState

    MESSAGE = ez.InputStream(str)
    NUMBER = ez.InputStream(float)
    JOINED = ez.OutputStream(str)
    REPUB = ez.OutputStream(CombinedMessage)

    async def initialize(self) -> None:
        self.STATE.number = 0.0

    @ez.subscriber(NUMBER)
    async def on_number(self, number: float) -> None:
        self.STATE.number = number

    @ez.subscriber(MESSAGE)
    @ez.publisher(JOINED)
    @ez.publisher(REPUB)
    async def on_message(self, message: str) -> AsyncGenerator:
        yield self.REPUB, CombinedMessage(string=message, number=self.STATE.number)
        yield self.JOINED, f"{message}|{self.STATE.number}"

    @ez.main
    def blocking_main(self) -> None:
        for i in range(3):
            ez.logger.info(i)
            time.sleep(1.0)
        raise ez.NormalTermination  # ezmsg's toy runs until Ctrl-C; the test copy ends


class ModifierCollection(ez.Collection):
    INPUT = ez.InputTopic(str)
    OUTPUT = ez.OutputTopic(str)

    SIN = LFO()
    MODIFIER = MessageModifier()
    REPUB_OUT = DebugOutput(DebugOutputSettings(name="REPUB"))

    def configure(self) -> None:
        self.SIN.apply_settings(LFOSettings(freq=0.1))

    def network(self) -> ez.NetworkDefinition:
        return (
            (self.SIN.OUTPUT, self.MODIFIER.NUMBER),
            (self.INPUT, self.MODIFIER.MESSAGE),
            (self.MODIFIER.JOINED, self.OUTPUT),
            (self.MODIFIER.REPUB, self.REPUB_OUT.INPUT),
        )


class TestSystemSettings(ez.Settings):
    name: str


class TestSystem(ez.Collection):
    SETTINGS = TestSystemSettings

    PING = MessageGenerator()
    FOO = MessageGenerator()
    MODIFIER_COLLECTION = ModifierCollection()
    PINGSUB1 = DebugOutput()
    PINGSUB2 = DebugOutput()
    FOOSUB = DebugOutput()

    def configure(self) -> None:
        self.PING.apply_settings(MessageGeneratorSettings(message="PING"))
        self.FOO.apply_settings(MessageGeneratorSettings(message="FOO"))
        self.PINGSUB1.apply_settings(DebugOutputSettings(name=f"{self.SETTINGS.name}1"))
        self.PINGSUB2.apply_settings(DebugOutputSettings(name=f"{self.SETTINGS.name}2"))

    def network(self) -> ez.NetworkDefinition:
        return (
            (self.PING.OUTPUT, self.PINGSUB1.INPUT),
            (self.PING.OUTPUT, self.MODIFIER_COLLECTION.INPUT),
            (self.MODIFIER_COLLECTION.OUTPUT, self.PINGSUB2.INPUT),
            (self.FOO.OUTPUT, self.FOOSUB.INPUT),
            (self.PING.OUTPUT, self.FOOSUB.INPUT),
        )

    def process_components(self) -> tuple[ez.Component, ...]:
        return (self.PING, self.FOOSUB, self.MODIFIER_COLLECTION, self.PINGSUB1)


if __name__ == "__main__":
    ez.run(SYSTEM=TestSystem(TestSystemSettings(name="A")))
