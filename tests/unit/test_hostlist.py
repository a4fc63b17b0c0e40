"""Hostlist expressions: Slurm's expansion rules, strict errors, and a round trip under hypothesis."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from remediation.hostlist import MAX_HOSTS, HostlistError, compress, expand

EXPANSIONS = [
    ("gpu-node-[0-3,7]", ["gpu-node-0", "gpu-node-1", "gpu-node-2", "gpu-node-3", "gpu-node-7"]),
    ("n[001-003]", ["n001", "n002", "n003"]),
    ("n[08-11]", ["n08", "n09", "n10", "n11"]),
    ("n[8-11]", ["n8", "n9", "n10", "n11"]),
    ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
    ("rack[1-2]-gpu[01-02].dc", ["rack1-gpu01.dc", "rack1-gpu02.dc", "rack2-gpu01.dc", "rack2-gpu02.dc"]),
    ("a[1-2],b3", ["a1", "a2", "b3"]),
    ("single", ["single"]),
    ("x[5]", ["x5"]),
    ("[1-2]", ["1", "2"]),
    ("a,a", ["a", "a"]),
    ("", []),
]


@pytest.mark.parametrize(("expr", "names"), EXPANSIONS, ids=[e for e, _ in EXPANSIONS])
def test_expand(expr: str, names: list[str]) -> None:
    assert expand(expr) == names


MALFORMED = [
    ("a[1-2", "unclosed"),
    ("a]1", "unbalanced"),
    ("a[[1]]", "nested"),
    ("a,,b", "empty host name"),
    (",a", "empty host name"),
    ("a[]", "empty brackets"),
    ("a[3-1]", "backwards"),
    ("a[1-]", "invalid range"),
    ("a[x]", "invalid range"),
    ("a[1-2-3]", "invalid range"),
    ("a[١-٣]", "invalid range"),  # Arabic-Indic digits: str.isdigit() is not enough
    ("a b", "invalid character"),
    ("a;rm", "invalid character"),
    ("a$(x)", "invalid character"),
    ("n[0-1000000]", "more than"),
    ("a[0-999],b[0-999999]", "more than"),
]


@pytest.mark.parametrize(("expr", "message"), MALFORMED, ids=[e for e, _ in MALFORMED])
def test_malformed_expressions_raise_a_clear_error(expr: str, message: str) -> None:
    with pytest.raises(HostlistError, match=message):
        expand(expr)


def test_size_cap_is_checked_before_expanding() -> None:
    # 10^18 names would exhaust memory if generated; the cap must trip at once.
    with pytest.raises(HostlistError, match="more than"):
        expand("n[0-999999999]m[0-999999999]")
    assert len(expand("n[1-1000]", limit=1000)) == 1000
    with pytest.raises(HostlistError):
        expand("n[0-1000]", limit=1000)
    assert MAX_HOSTS == 1_000_000


COMPRESSIONS = [
    (["gpu-node-0", "gpu-node-1", "gpu-node-2", "gpu-node-3", "gpu-node-7"], "gpu-node-[0-3,7]"),
    (["n003", "n001", "n002", "n001"], "n[001-003]"),
    (["b3", "a2", "a1"], "a[1-2],b3"),
    (["login"], "login"),
    (["n7", "n07"], "n7,n07"),
    ([], ""),
]


@pytest.mark.parametrize(("names", "expr"), COMPRESSIONS, ids=[c for _, c in COMPRESSIONS])
def test_compress(names: list[str], expr: str) -> None:
    assert compress(names) == expr


def test_compress_rejects_names_that_are_not_plain() -> None:
    with pytest.raises(HostlistError):
        compress(["ok", "not ok"])


_names = st.builds(
    lambda prefix, number, width: f"{prefix}{str(number).zfill(width)}" if number is not None else prefix,
    st.sampled_from(["gpu-node-", "n", "rack1-", "a.b_", "x"]),
    st.one_of(st.none(), st.integers(min_value=0, max_value=3000)),
    st.integers(min_value=0, max_value=4),
)


@given(st.lists(_names, max_size=60))
@settings(max_examples=300, deadline=None)
def test_compress_then_expand_gives_back_the_same_set(names: list[str]) -> None:
    expr = compress(names)
    expanded = expand(expr)
    assert set(expanded) == set(names)
    assert len(expanded) == len(set(names))


@given(st.text(alphabet="ab01-9[],-_. x$", max_size=40))
@settings(max_examples=2000, deadline=None)
def test_fuzz_expand_either_expands_or_raises_hostlist_error(expr: str) -> None:
    try:
        names = expand(expr, limit=10_000)
    except HostlistError as exc:
        assert str(exc)
        return
    assert all(name and "[" not in name and "," not in name for name in names)


@given(st.text(max_size=30))
@settings(max_examples=500, deadline=None)
def test_fuzz_expand_arbitrary_text(expr: str) -> None:
    try:
        expand(expr, limit=10_000)
    except HostlistError:
        pass
