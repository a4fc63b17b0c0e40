"""Field and label selectors, as the kube-apiserver parses and applies them.

A field the resource does not register is a 400 "field label not supported". Label selectors take the
equality, set and existence forms; ``!=`` and ``notin`` match objects without the label.

Why: docs/kubernetes.md#inside-the-local-kube-apiserver
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

Obj = dict[str, Any]
Matcher = Callable[[Obj], bool]


class SelectorError(ValueError):
    """A selector the server rejects (HTTP 400)."""


def _get(obj: Obj, path: str) -> str:
    cur: Any = obj
    for part in path.split("."):
        if not isinstance(cur, dict):
            return ""
        cur = cur.get(part)
    if cur is None:
        return ""
    if isinstance(cur, bool):
        return "true" if cur else "false"
    return str(cur)


# The fields each resource registers for field selection (metadata.name and metadata.namespace are
# always allowed; a subset of what the real apiserver registers, enough for what controllers use).
FIELDS: dict[str, frozenset[str]] = {
    "nodes": frozenset({"metadata.name", "spec.unschedulable"}),
    "pods": frozenset(
        {
            "metadata.name",
            "metadata.namespace",
            "spec.nodeName",
            "spec.restartPolicy",
            "spec.schedulerName",
            "spec.serviceAccountName",
            "status.phase",
            "status.podIP",
            "status.nominatedNodeName",
        }
    ),
    "events": frozenset(
        {
            "involvedObject.kind",
            "involvedObject.namespace",
            "involvedObject.name",
            "involvedObject.uid",
            "involvedObject.apiVersion",
            "involvedObject.resourceVersion",
            "involvedObject.fieldPath",
            "reason",
            "reportingComponent",
            "source",
            "type",
        }
    ),
}


def field_selector(resource: str, text: str | None) -> Matcher:
    """Compile a fieldSelector for a resource; raises SelectorError for unsupported fields."""
    terms: list[tuple[str, bool, str]] = []
    for raw in (text or "").split(","):
        term = raw.strip()
        if not term:
            continue
        if "!=" in term:
            key, value = term.split("!=", 1)
            negate = True
        elif "==" in term:
            key, value = term.split("==", 1)
            negate = False
        elif "=" in term:
            key, value = term.split("=", 1)
            negate = False
        else:
            raise SelectorError(f"invalid selector: '{text}'; can't understand '{term}'")
        key = key.strip()
        if key not in FIELDS.get(resource, frozenset()) and key not in (
            "metadata.name",
            "metadata.namespace",
        ):
            raise SelectorError(f"field label not supported: {key}")
        terms.append((key, negate, value.strip()))

    def match(obj: Obj) -> bool:
        return all((_get(obj, key) == value) != negate for key, negate, value in terms)

    return match


_TERM_SPLIT = re.compile(r",(?![^()]*\))")  # commas outside "in (a,b)" parentheses
_SET_TERM = re.compile(r"^(?P<key>[^\s!=()]+)\s+(?P<op>in|notin)\s+\((?P<values>[^()]*)\)$")
_KEY = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._/-]*[A-Za-z0-9])?$")


def _check_key(key: str, text: str) -> str:
    if not _KEY.match(key):
        raise SelectorError(f"unable to parse requirement: invalid label key {key!r} in {text!r}")
    return key


def label_selector(text: str | None) -> Matcher:
    """Compile a labelSelector; raises SelectorError when it does not parse."""
    terms: list[tuple[str, str, frozenset[str]]] = []  # (op, key, values)
    for raw in _TERM_SPLIT.split(text or ""):
        term = raw.strip()
        if not term:
            continue
        if m := _SET_TERM.match(term):
            values = frozenset(v.strip() for v in m["values"].split(",") if v.strip())
            terms.append((m["op"], _check_key(m["key"], text or ""), values))
        elif "!=" in term:
            key, value = (s.strip() for s in term.split("!=", 1))
            terms.append(("notin", _check_key(key, text or ""), frozenset({value})))
        elif "=" in term:
            key, value = (s.strip() for s in term.replace("==", "=").split("=", 1))
            terms.append(("in", _check_key(key, text or ""), frozenset({value})))
        elif term.startswith("!"):
            terms.append(("absent", _check_key(term[1:].strip(), text or ""), frozenset()))
        else:
            terms.append(("exists", _check_key(term, text or ""), frozenset()))

    def holds(op: str, key: str, values: frozenset[str], *, labels: dict[str, str]) -> bool:
        if op == "in":
            return labels.get(key) in values
        if op == "notin":
            return labels.get(key) not in values
        return (key in labels) == (op == "exists")

    def match(obj: Obj) -> bool:
        labels = (obj.get("metadata") or {}).get("labels") or {}
        return all(holds(op, key, values, labels=labels) for op, key, values in terms)

    return match


def to_label_selector(text: str) -> Obj:
    """A selector string as the ``LabelSelector`` object a PDB or DaemonSet carries (the inverse of
    :func:`selector_matcher`): equality terms become ``matchLabels``, the rest ``matchExpressions``."""
    labels: dict[str, str] = {}
    expressions: list[Obj] = []
    ops = {"in": "In", "notin": "NotIn", "exists": "Exists", "absent": "DoesNotExist"}
    for raw in _TERM_SPLIT.split(text):
        term = raw.strip()
        if not term:
            continue
        if m := _SET_TERM.match(term):
            values = sorted(v.strip() for v in m["values"].split(",") if v.strip())
            expressions.append({"key": m["key"], "operator": ops[m["op"]], "values": values})
        elif "!=" in term:
            key, value = (s.strip() for s in term.split("!=", 1))
            expressions.append({"key": key, "operator": "NotIn", "values": [value]})
        elif "=" in term:
            key, value = (s.strip() for s in term.replace("==", "=").split("=", 1))
            labels[key] = value
        elif term.startswith("!"):
            expressions.append({"key": term[1:].strip(), "operator": "DoesNotExist"})
        else:
            expressions.append({"key": term, "operator": "Exists"})
    label_selector(text)  # the same parse errors as a query's labelSelector
    out: Obj = {}
    if labels:
        out["matchLabels"] = labels
    if expressions:
        out["matchExpressions"] = expressions
    return out


def selector_matcher(selector: Obj | None) -> Matcher:
    """Compile a ``LabelSelector`` object. An empty selector matches everything, as on a PDB in
    policy/v1; a missing one (``None``) matches nothing."""
    if selector is None:
        return lambda obj: False
    terms = [f"{k}={v}" for k, v in (selector.get("matchLabels") or {}).items()]
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], ",".join(expr.get("values") or [])
        terms.append(
            {"In": f"{key} in ({values})", "NotIn": f"{key} notin ({values})", "Exists": key}.get(
                op, f"!{key}"
            )
        )
    return label_selector(",".join(terms))
