"""Metric names a PromQL expression reads (a rule's or a dashboard panel's), without a full parser.

Grafana variables, string literals, label matchers, ranges and the label lists of
``by``/``without``/``on``/``ignoring``/``group_left``/``group_right`` are removed first;
what is left is identifiers, and an identifier is a metric name unless a ``(`` follows it
(a function or aggregation) or it is a keyword or a number.
"""

from __future__ import annotations

import re

_NAME_MATCHER = re.compile(r"""__name__\s*=\s*(?:"([^"\\]*)"|'([^'\\]*)')""")
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_VARIABLE = re.compile(r"\$\{[^}]*\}|\$\w+|\[\[[^\]]*\]\]")
_BRACES = re.compile(r"\{[^{}]*\}")
_BRACKETS = re.compile(r"\[[^\[\]]*\]")
_LABEL_LIST = re.compile(
    r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)", re.IGNORECASE
)
_TOKEN = re.compile(r"\d[\w.]*|[A-Za-z_:][\w:]*(?:\s*\()?")
KEYWORDS = frozenset(
    {
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
        "offset",
        "bool",
        "and",
        "or",
        "unless",
        "atan2",
        "inf",
        "nan",
        # aggregation operators, for ``sum by (x) (...)`` once its label list is gone
        "sum",
        "avg",
        "min",
        "max",
        "count",
        "group",
        "stddev",
        "stdvar",
        "topk",
        "bottomk",
        "quantile",
        "count_values",
        "limitk",
        "limit_ratio",
    }
)


def metric_names(expr: str) -> set[str]:
    names = {a or b for a, b in _NAME_MATCHER.findall(expr)}
    text = _STRING.sub('""', expr)
    # A variable can stand for a number (a threshold) or a duration; a number is neutral.
    text = _VARIABLE.sub("1", text)
    text = _BRACES.sub(" ", text)
    text = _BRACKETS.sub(" ", text)
    text = _LABEL_LIST.sub(" ", text)
    for token in _TOKEN.findall(text):
        if token[0].isdigit() or token.endswith("("):
            continue
        if token.lower() in KEYWORDS:
            continue
        names.add(token)
    return names
