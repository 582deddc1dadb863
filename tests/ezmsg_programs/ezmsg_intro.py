"""ezmsg's introduction example, rewritten for ezflow's tests with the same structure:
a counter, a unit adding one, a printer ending the graph. Only the import line differs
from the ezmsg program (tests/test_ezmsg.py runs it under both and compares)."""

from collections.abc import AsyncGenerator
from dataclasses import dataclass

import ezflow.compat.ezmsg as ez


@dataclass
class CountMessage:
    value: int


class CountSettings(ez.Settings):
    iterations: int


class Count(ez.Unit):
    SETTINGS = CountSettings

    OUTPUT_COUNT = ez.OutputStream(CountMessage)

    @ez.publisher(OUTPUT_COUNT)
    async def count(self) -> AsyncGenerator:
        for value in range(self.SETTINGS.iterations):
            yield self.OUTPUT_COUNT, CountMessage(value=value)


class AddOne(ez.Unit):
    INPUT_COUNT = ez.InputStream(CountMessage)
    OUTPUT_PLUS_ONE = ez.OutputStream(CountMessage)

    @ez.subscriber(INPUT_COUNT)
    @ez.publisher(OUTPUT_PLUS_ONE)
    async def on_message(self, message: CountMessage) -> AsyncGenerator:
        yield self.OUTPUT_PLUS_ONE, CountMessage(value=message.value + 1)


class PrintSettings(ez.Settings):
    iterations: int


class PrintState(ez.State):
    seen: int = 0


class PrintValue(ez.Unit):
    SETTINGS = PrintSettings
    STATE = PrintState

    INPUT = ez.InputStream(CountMessage)

    @ez.subscriber(INPUT)
    async def on_message(self, message: CountMessage) -> None:
        print(f"Current Count: {message.value}", flush=True)
        self.STATE.seen += 1
        if self.STATE.seen == self.SETTINGS.iterations:
            raise ez.NormalTermination


class CountSystemSettings(ez.Settings):
    iterations: int


class CountSystem(ez.Collection):
    SETTINGS = CountSystemSettings

    COUNT = Count()
    ADD_ONE = AddOne()
    PRINT = PrintValue()

    def configure(self) -> None:
        self.COUNT.apply_settings(CountSettings(iterations=self.SETTINGS.iterations))
        self.PRINT.apply_settings(PrintSettings(iterations=self.SETTINGS.iterations))

    def network(self) -> ez.NetworkDefinition:
        return (
            (self.COUNT.OUTPUT_COUNT, self.ADD_ONE.INPUT_COUNT),
            (self.ADD_ONE.OUTPUT_PLUS_ONE, self.PRINT.INPUT),
        )

    def process_components(self) -> tuple[ez.Component, ...]:
        return (self.COUNT, self.ADD_ONE, self.PRINT)


if __name__ == "__main__":
    ez.run(CountSystem(CountSystemSettings(iterations=10)))
