"""kbframe.sorting: the radix-sort trick gives numpy's stable order exactly, one sort numpy's
distinct values."""
import numpy as np
import pytest

from kbframe.sorting import distinct, groups, stable_order


@pytest.mark.parametrize("keys", [
    np.array([3, 1, 3, 0, 1, 3], dtype=np.int64),               # ties keep their order
    np.array([-5, 7, -5, 32767, -32768, 0], dtype=np.int64),    # the int16 range's ends
    np.array([1 << 20, 3, 1 << 20, 2], dtype=np.int64),         # too wide: merge sort
    np.array([2, 0, 2, 1], dtype=np.uint32),
    np.array([], dtype=np.int64),
])
def test_stable_order_is_numpys_stable_argsort(keys):
    assert stable_order(keys).tolist() == np.argsort(keys, kind="stable").tolist()


def test_stable_order_of_pe_codes():
    assert stable_order(np.array([1, 0, 1, 0, 2])).tolist() == [1, 3, 0, 2, 4]


@pytest.mark.parametrize("keys", [np.array([3, 1, 3, 0, 1, 3]), np.array([7]), np.array([], dtype=np.int64),
                                  np.array([1 << 40, 5, 1 << 40])])
def test_groups_are_numpys_unique_of_the_stable_order(keys):
    order, values, starts = groups(keys)
    want_values, want_starts = np.unique(keys[np.argsort(keys, kind="stable")], return_index=True)
    assert order.tolist() == np.argsort(keys, kind="stable").tolist()
    assert values.tolist() == want_values.tolist() and starts.tolist() == want_starts.tolist()


@pytest.mark.parametrize("values", [np.array([3, 1, 3, 0, 1, 3]), np.array([7]), np.array([], dtype=np.int64),
                                    np.array([1 << 40, -5, 1 << 40, -5]), np.array([[2, 1], [1, 0]])])
def test_distinct_is_numpys_unique(values):
    got = distinct(values)
    assert got.tolist() == np.unique(values).tolist() and got.dtype == np.unique(values).dtype
