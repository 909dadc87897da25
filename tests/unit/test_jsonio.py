"""slinky.jsonio reads and writes what the standard library's json did, faster."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slinky import jsonio

values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**64), max_value=2**64)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=30,
)


@settings(deadline=None)  # no wall-clock limit: a loaded CI machine is slow, not wrong
@given(values)
def test_reads_and_writes_what_the_standard_library_does(value: object) -> None:
    text = json.dumps(value)
    assert jsonio.loads(text.encode()) == json.loads(text)
    assert jsonio.loads(text) == json.loads(text)
    assert json.loads(jsonio.dumps(value)) == value


def test_a_document_msgspec_refuses_is_read_by_the_standard_library() -> None:
    assert math.isnan(jsonio.loads(b'{"a": NaN}')["a"])
    assert jsonio.loads(b"[1e400]") == [math.inf]
    assert jsonio.loads(b'"\\ud800"') == "\ud800"
    # Not UTF-8: read with replacement characters, as the clients read `resp.text` before.
    assert jsonio.loads(b'"\xff"') == "\ufffd"


@pytest.mark.parametrize("bad", [b"", b"[1,", b"{'a': 1}", b"nope"])
def test_what_is_not_json_raises_a_value_error(bad: bytes) -> None:
    with pytest.raises(ValueError):
        jsonio.loads(bad)


def test_what_json_cannot_hold_raises_a_type_error() -> None:
    with pytest.raises(TypeError):
        jsonio.dumps(object())
    assert json.loads(jsonio.dumps({1: [2**70]})) == {"1": [2**70]}
    # Keys msgspec refuses and the standard library writes, as it did.
    assert json.loads(jsonio.dumps({None: 1, True: 2})) == {"null": 1, "true": 2}
