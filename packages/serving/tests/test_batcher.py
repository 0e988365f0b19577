import threading

import numpy as np
import pytest

from jaxstack.serving import ArtifactError, DynamicBatcher, InvalidInputError, ServerBusyError


class Model:
    """A run_fn that records batch shapes and can be held to let a queue build up."""

    def __init__(self, hold_first: bool = False):
        self.shapes: list[int] = []
        self.release = threading.Event()
        self.entered = threading.Event()
        if not hold_first:
            self.release.set()

    def __call__(self, inputs):
        self.entered.set()
        self.release.wait(30)
        x = inputs["x"]
        self.shapes.append(x.shape[0])
        return {"double": 2 * x, "row_sum": x.sum(axis=1, keepdims=True)}


def rows(start, n):
    return np.arange(start * 3, (start + n) * 3, dtype=np.float32).reshape(n, 3)


def test_queued_requests_are_merged_padded_and_split_back():
    model, stats = Model(hold_first=True), []
    batcher = DynamicBatcher(model, max_batch_size=4, batch_sizes=(1, 2, 4),
                             max_queue_delay_s=0, on_batch=stats.append)  # fmt: skip
    first = batcher.submit({"x": rows(0, 1)})
    assert model.entered.wait(10)
    futures = [batcher.submit({"x": rows(i, 1)}) for i in range(1, 11)]
    model.release.set()
    results = [f.result(10) for f in [first, *futures]]
    for i, out in enumerate(results):
        np.testing.assert_array_equal(out["double"], 2 * rows(i, 1))
        np.testing.assert_array_equal(out["row_sum"], rows(i, 1).sum(1, keepdims=True))
    assert model.shapes == [1, 4, 4, 2]
    assert [s.rows for s in stats] == [1, 4, 4, 2]
    assert [s.requests for s in stats] == [1, 4, 4, 2]
    batcher.close()


def test_rows_are_padded_to_the_next_compiled_size():
    model, stats = Model(hold_first=True), []
    batcher = DynamicBatcher(model, max_batch_size=8, batch_sizes=(1, 8), max_queue_delay_s=0,
                             on_batch=stats.append, trim_padding=False)  # fmt: skip
    blocker = batcher.submit({"x": rows(0, 1)})
    assert model.entered.wait(10)
    a = batcher.submit({"x": rows(1, 2)})
    b = batcher.submit({"x": rows(3, 1)})
    model.release.set()
    blocker.result(10)
    np.testing.assert_array_equal(a.result(10)["double"], 2 * rows(1, 2))
    np.testing.assert_array_equal(b.result(10)["double"], 2 * rows(3, 1))
    assert model.shapes == [1, 8]
    assert (stats[1].rows, stats[1].padded_rows) == (3, 8)
    batcher.close()


def test_trimming_runs_a_smaller_size_rather_than_mostly_padding():
    model, stats = Model(hold_first=True), []
    batcher = DynamicBatcher(model, max_batch_size=8, max_queue_delay_s=0, on_batch=stats.append)
    blocker = batcher.submit({"x": rows(0, 1)})
    assert model.entered.wait(10)
    futures = [batcher.submit({"x": rows(i, 1)}) for i in range(1, 6)]
    model.release.set()
    blocker.result(10)
    for i, f in enumerate(futures, start=1):
        np.testing.assert_array_equal(f.result(10)["double"], 2 * rows(i, 1))
    # 5 queued rows: 4 now (no padding) and 1 next, rather than 8 with 3 rows of padding.
    assert model.shapes == [1, 4, 1]
    assert sum(s.padded_rows - s.rows for s in stats) == 0
    batcher.close()


def test_requests_within_the_queue_delay_share_a_batch():
    model, stats = Model(), []
    batcher = DynamicBatcher(model, max_batch_size=8, max_queue_delay_s=0.5, on_batch=stats.append)
    futures = [batcher.submit({"x": rows(i, 1)}) for i in range(3)]
    for f in futures:
        f.result(10)
    assert [s.rows for s in stats] == [3]
    assert model.shapes == [4]
    batcher.close()


def test_full_queue_refuses_and_too_large_requests_are_invalid():
    model = Model(hold_first=True)
    batcher = DynamicBatcher(model, max_batch_size=4, max_queue_size=2, max_queue_delay_s=0)
    running = batcher.submit({"x": rows(0, 1)})
    assert model.entered.wait(10)
    queued = [batcher.submit({"x": rows(1, 1)}), batcher.submit({"x": rows(2, 1)})]
    with pytest.raises(ServerBusyError, match="queue is full"):
        batcher.submit({"x": rows(3, 1)})
    with pytest.raises(InvalidInputError, match="5 rows"):
        batcher.submit({"x": rows(0, 5)})
    model.release.set()
    assert [f.result(10)["double"].shape for f in [running, *queued]] == [(1, 3)] * 3
    batcher.close()


def test_close_drains_queued_requests_and_refuses_new_ones():
    model = Model(hold_first=True)
    batcher = DynamicBatcher(model, max_batch_size=2, max_queue_delay_s=0)
    futures = [batcher.submit({"x": rows(i, 1)}) for i in range(5)]
    assert model.entered.wait(10)
    batcher.close(wait=False)
    with pytest.raises(ServerBusyError, match="draining"):
        batcher.submit({"x": rows(0, 1)})
    model.release.set()
    batcher.close()
    for i, f in enumerate(futures):
        np.testing.assert_array_equal(f.result(0)["double"], 2 * rows(i, 1))


def test_a_failing_batch_fails_its_requests_and_the_batcher_goes_on():
    calls = []

    def flaky(inputs):
        calls.append(inputs["x"].shape[0])
        if len(calls) == 1:
            raise RuntimeError("boom")
        return {"y": inputs["x"] + 1}

    batcher = DynamicBatcher(flaky, max_batch_size=4, max_queue_delay_s=0)
    with pytest.raises(RuntimeError, match="boom"):
        batcher.submit({"x": rows(0, 1)}).result(10)
    np.testing.assert_array_equal(batcher.submit({"x": rows(1, 1)}).result(10)["y"], rows(1, 1) + 1)
    batcher.close()


def test_an_output_without_the_batch_dimension_fails_its_requests_and_the_batcher_goes_on():
    calls = []

    def scalar_then_fine(inputs):
        calls.append(inputs["x"].shape[0])
        if len(calls) == 1:
            return {"y": np.float32(1.0)}  # no leading batch dimension to slice
        return {"y": inputs["x"] + 1}

    batcher = DynamicBatcher(scalar_then_fine, max_batch_size=4, max_queue_delay_s=0)
    with pytest.raises(ArtifactError, match=r"output .y. has shape"):
        batcher.submit({"x": rows(0, 1)}).result(10)
    np.testing.assert_array_equal(batcher.submit({"x": rows(1, 1)}).result(10)["y"], rows(1, 1) + 1)
    batcher.close()
