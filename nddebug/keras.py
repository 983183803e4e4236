"""A Keras callback that checks a training step now and then during ``model.fit``."""

from __future__ import annotations

import warnings
from typing import Any

import keras

from nddebug.errors import NddebugError

#: How check()'s warnings about what its runs added to the user's files begin: the callback
#: says them even when the check passed (probe round 36: summaries written in train_step).
SIDE_EFFECTS = ("The step writes summaries", "The step saves checkpoints")


class NonDeterminismError(NddebugError):
    """Raised by DeterminismCheck(on_failure="raise"); ``.report`` holds the report."""

    def __init__(self, report: Any) -> None:
        super().__init__(str(report))
        self.report = report


class DeterminismCheck(keras.callbacks.Callback):
    """Every ``every_n_steps`` training steps, check that step with :func:`nddebug.check`.

    The checked step's own batch is taken from fit's iterator, checked ``repeats`` times with
    the model's state restored each time, and then trained on exactly as fit would have (with
    the model's original train function), so training is not changed by the check. With
    ``steps_per_execution`` above 1, a call of the train function trains on that many batches:
    a check then covers the whole call, every batch of it.
    Reports are kept in ``self.reports``; on a divergence it warns or raises.
    """

    def __init__(
        self, every_n_steps: int = 100, repeats: int = 2, on_failure: str = "warn"
    ) -> None:
        super().__init__()
        if on_failure not in ("warn", "raise"):
            raise ValueError(f"on_failure must be 'warn' or 'raise', not {on_failure!r}")
        if every_n_steps < 1:
            raise ValueError(f"every_n_steps must be at least 1, got {every_n_steps}")
        self.every_n_steps = every_n_steps
        self.repeats = repeats
        self.on_failure = on_failure
        self.reports: list[Any] = []
        self._said: set[str] = set()  # side-effect warnings already given (see SIDE_EFFECTS)
        self._step = 0  # training steps (batches) done before this call, over all epochs
        self._begin = 0
        self._original: Any = None

    def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
        # One call per execution of the train function, which trains on up to
        # ``steps_per_execution`` batches: check it if one of them is due.
        self._begin = batch
        due = any((self._step + k) % self.every_n_steps == 0 for k in range(self._per_call()))
        if due:
            self._original = self.model.train_function
            self.model.train_function = self._checked_step

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        self._restore()
        self._step += max(1, batch - self._begin + 1)  # the steps this call trained

    def _restore(self) -> None:
        """Put the model's own train function back (once)."""
        if self._original is not None:
            self.model.train_function = self._original
            self._original = None

    def _per_call(self) -> int:
        return max(1, int(getattr(self.model, "steps_per_execution", 1) or 1))

    def _checked_step(self, iterator: Any) -> Any:
        try:
            return self._check_and_train(iterator)
        finally:
            # Also when the check raises (on_failure="raise" stops fit, and no batch end
            # comes): a later fit or train_on_batch must not go on checking.
            self._restore()

    def _check_and_train(self, iterator: Any) -> Any:
        import tensorflow as tf

        from nddebug.check import check

        model, original = self.model, self._original
        # Every batch this call of the train function would have taken (steps_per_execution
        # of them, fewer at the end of the data), so the check covers them all and training
        # then goes on with each of them, as fit would have.
        try:
            taken = [next(iterator)]
        except (StopIteration, tf.errors.OutOfRangeError):
            # The epoch's last call on data of unknown length, which finds none: nothing to
            # check, and the model's own function does what fit's call does there (Keras
            # still counts an optimizer step: dropping that call changed Adam's every later
            # update; probe round 45, F1).
            return original(iterator)
        for _ in range(self._per_call() - 1):
            try:
                taken.append(next(iterator))
            except (StopIteration, tf.errors.OutOfRangeError):
                break
        batches = [_global_batch(model, data) for data in taken]
        distributed = any(
            isinstance(x, tf.distribute.DistributedValues)
            for data in taken
            for x in tf.nest.flatten(data)
        )

        spec = getattr(iterator, "element_spec", None)

        def batch_iterator() -> Any:
            # Same iterator type and element spec as fit's: the train function is not
            # retraced. A spec with a static batch size (fit on arrays) is met by the batch
            # as one element; a traced function with an unknown batch size counted each
            # output's loss once per batch, not per sample (fit's History changed).
            ds = None
            for data in batches:
                one = tf.data.Dataset.from_tensors(data)
                if one.element_spec != spec:
                    size = int(tf.nest.flatten(data)[0].shape[0])
                    one = tf.data.Dataset.from_tensor_slices(data).batch(size)
                ds = one if ds is None else ds.concatenate(one)
            return iter(model.distribute_strategy.experimental_distribute_dataset(ds))

        def step() -> Any:
            model.make_train_function()  # check() has cleared it: built inside the trace
            if distributed:
                # Each replica's part as fit's iterator gave it, one train step per batch:
                # a distributed iterator made per repeat would hand the step a new random
                # incarnation id each time (an input that differs by design).
                return model.train_function(iter(taken))
            return model.train_function(batch_iterator())

        # The model's own train function while checking, not this wrapper: check() runs the
        # step as compiled first when the model uses XLA (jit_compile=True), and that pass
        # keeps the model's function, which would otherwise be this check calling itself.
        model.train_function = original
        report = check(step, repeats=self.repeats, state=model, advance=False)
        self.reports.append(report)
        outputs = original(batch_iterator())
        # What the checks add to the user's files is said once, passed or not (the report of
        # a check that passed is not shown).
        for said in report.warnings:
            if said.startswith(SIDE_EFFECTS) and said not in self._said:
                self._said.add(said)
                warnings.warn(f"nddebug: {said}", stacklevel=2)
        if not report.ok:
            if self.on_failure == "raise":
                raise NonDeterminismError(report)
            first = self._step
            steps = (
                f"step {first}"
                if len(batches) == 1
                else f"steps {first}-{first + len(batches) - 1}"
            )
            warnings.warn(f"nddebug: training {steps}:\n{report}", stacklevel=2)
        return outputs


def _global_batch(model: Any, data: Any) -> Any:
    """A batch as the dataset gave it: under a tf.distribute strategy fit's iterator hands
    out each replica's part (PerReplica values), which are joined back in replica order, so
    that distributing the batch again splits it as fit did."""
    import tensorflow as tf

    strategy = model.distribute_strategy

    def join(x: Any) -> Any:
        if isinstance(x, tf.distribute.DistributedValues):
            parts = strategy.experimental_local_results(x)
            return tf.concat(parts, 0) if len(parts) > 1 else parts[0]
        return x

    return tf.nest.map_structure(join, data)
