"""An engine that runs a process function over a loader's batches and calls the handlers attached to its events,
checking each handler's signature when it is attached, as ignite does."""

import enum
import inspect


class Events(enum.Enum):
    STARTED = "started"
    EPOCH_STARTED = "epoch_started"
    ITERATION_COMPLETED = "iteration_completed"
    EPOCH_COMPLETED = "epoch_completed"
    COMPLETED = "completed"


class State:
    def __init__(self):
        self.epoch = 0
        self.iteration = 0
        self.output = None


class Engine:
    def __init__(self, process_function):
        self._process_function = process_function
        self._handlers = {event: [] for event in Events}
        self.state = State()

    def add_event_handler(self, event_name, handler, *args, **kwargs):
        # As ignite does: the handler must take the engine and the arguments given (TypeError otherwise).
        inspect.signature(handler).bind(self, *args, **kwargs)
        self._handlers[event_name].append((handler, args, kwargs))

    def on(self, event_name, *args, **kwargs):
        def decorator(handler):
            self.add_event_handler(event_name, handler, *args, **kwargs)
            return handler

        return decorator

    def _fire_event(self, event_name):
        for handler, args, kwargs in self._handlers[event_name]:
            handler(self, *args, **kwargs)

    def run(self, data, max_epochs=1):
        self.state = State()
        self._fire_event(Events.STARTED)
        while self.state.epoch < max_epochs:
            self.state.epoch += 1
            self._fire_event(Events.EPOCH_STARTED)
            for batch in data:
                self.state.iteration += 1
                self.state.output = self._process_function(self, batch)
                self._fire_event(Events.ITERATION_COMPLETED)
            self._fire_event(Events.EPOCH_COMPLETED)
        self._fire_event(Events.COMPLETED)
        return self.state
