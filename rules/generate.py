"""Render the rule files for your site: ``rules/*.rules.yml`` are the rendering with the defaults.

    python rules/generate.py --out my-rules/ --sidecar-selector 'job="llm/kv-sidecar"'
    python rules/generate.py --out my-rules/ --capacity-ceiling org/model-a=8 --capacity-ceiling b=4

In the monitoring-mixin shape (kubernetes-mixin's ``_config`` selectors): what the rules
cannot know about your Prometheus is a parameter with a default, and the committed files
are written with the defaults, so they load as they are, and a rendering without
parameters is the committed file byte for byte. The parameter:

``sidecar_selector``
    The label matchers that pick the sidecar's own scrape job out of ``up``, in
    ``KvHeadroomSidecarDown`` and ``KvHeadroomSidecarAbsent`` (the expression and the
    description that quotes it). Default ``job=~".*kv-headroom.*"``: a job with
    ``kv-headroom`` in its name, as a PodMonitor called ``kv-headroom`` gives. The sidecar's
    ``kv_headroom_*`` series and vLLM's ``vllm:*`` series need none: their names are theirs.

``capacity_ceilings``
    Per model, the pods the capacity runway is measured against where that is not the
    pods running now: an autoscaler's replica ceiling, a GPU quota. The record
    ``model:kv_headroom_pods:ceiling`` is written ``vector(1) < 0`` (nothing: every model
    is measured against its pods now) and becomes one series per model declared,
    ``label_replace(vector(PODS), "model", "MODEL", "", "")`` joined with ``or``.

``deploy/generate.py --sidecar-selector`` and ``--capacity-ceiling`` render the
PrometheusRules the same way. Every ``up{...}`` in a rule file must be written with the
default selector: one written otherwise would stay as written whatever the parameter says,
so it is refused, naming file and line.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any

import yaml

__all__ = [
    "CEILING_RECORD",
    "NO_CEILING",
    "SIDECAR_SELECTOR",
    "RenderError",
    "ceiling_expr",
    "main",
    "parse_ceiling",
    "render",
    "rendered",
    "rule_files",
]

HERE = Path(__file__).resolve().parent
SIDECAR_SELECTOR = 'job=~".*kv-headroom.*"'
# `up` and only `up`: kv_headroom_source_up{...} has a word character before "up".
_UP = re.compile(r"\bup\{([^{}]*)\}")
CEILING_RECORD = "model:kv_headroom_pods:ceiling"
NO_CEILING = "vector(1) < 0"  # an empty vector: no model has a declared ceiling
# The ceiling record as the committed file writes it; the one place the parameter lands.
_CEILING = re.compile(
    rf"^(?P<head>\s*- record: {re.escape(CEILING_RECORD)}\n\s*expr: ){re.escape(NO_CEILING)}$",
    re.MULTILINE,
)


class RenderError(Exception):
    """A rule file or a parameter that cannot be rendered; the message is one line."""


def check_selector(selector: str) -> str:
    """The selector as given, or RenderError: label matchers that fit inside ``up{...}``."""
    if not selector.strip():
        raise RenderError("--sidecar-selector is empty: up{} selects nothing in PromQL")
    if any(c in selector for c in "{}\n"):
        raise RenderError(
            f"--sidecar-selector {selector!r}: give the matchers inside the braces, one line, "
            'as in job="llm/kv-sidecar"'
        )
    return selector


def parse_ceiling(text: str) -> tuple[str, int]:
    """``MODEL=PODS`` as (model, pods), or RenderError: the model as its sidecars report it
    in kv_headroom_info{model}, the pods a whole number above 0."""
    model, sep, pods = text.rpartition("=")
    if not sep or not model:
        raise RenderError(f"--capacity-ceiling {text!r}: give MODEL=PODS, e.g. org/model=8")
    if any(c in model for c in '"\\\n{}'):
        raise RenderError(f"--capacity-ceiling {text!r}: a model name without quotes or braces")
    if not pods.isdigit() or int(pods) < 1:
        raise RenderError(f"--capacity-ceiling {text!r}: PODS is a whole number of pods, 1 or more")
    return model, int(pods)


def ceiling_expr(ceilings: dict[str, int]) -> str:
    """The expression of the ceiling record for these ceilings (NO_CEILING for none): what
    the capacityCeilings Parameter of deploy/kubernetes takes, too."""
    if not ceilings:
        return NO_CEILING
    return " or ".join(
        f'label_replace(vector({pods}), "model", "{model}", "", "")'
        for model, pods in sorted(ceilings.items())
    )


def _replaced(value: Any, selector: str) -> Any:
    """A loaded rule file with the selector replaced in every string, to check the text."""
    if isinstance(value, str):
        return value.replace(f"up{{{SIDECAR_SELECTOR}}}", f"up{{{selector}}}")
    if isinstance(value, list):
        return [_replaced(v, selector) for v in value]
    if isinstance(value, dict):
        return {k: _replaced(v, selector) for k, v in value.items()}
    return value


def _with_ceilings(text: str, ceilings: dict[str, int], source: str) -> str:
    """The text with the ceiling record's expression for these ceilings; refused when the
    result does not load as exactly that expression."""
    expr = ceiling_expr(ceilings)
    out = _CEILING.sub(lambda m: m.group("head") + expr, text)
    loaded = yaml.safe_load(out)
    exprs = [
        rule["expr"]
        for group in loaded["groups"]
        for rule in group["rules"]
        if rule.get("record") == CEILING_RECORD
    ]
    if exprs != [expr]:
        raise RenderError(f"{source}: --capacity-ceiling does not survive YAML unchanged")
    return out


def render(
    text: str,
    *,
    sidecar_selector: str = SIDECAR_SELECTOR,
    capacity_ceilings: dict[str, int] | None = None,
    source: str = "rules",
) -> str:
    """A rule file's text with the parameters applied; ``text`` itself for the defaults.

    The text is rewritten, not the loaded YAML, so comments and layout stay; the result is
    loaded again and must equal the loaded file with the selector replaced in its strings
    (a selector YAML would read otherwise is refused)."""
    for m in _UP.finditer(text):
        if m.group(1) != SIDECAR_SELECTOR:
            line = text.count("\n", 0, m.start()) + 1
            raise RenderError(
                f"{source}:{line}: up{{{m.group(1)}}} is not written up{{{SIDECAR_SELECTOR}}}, "
                "so --sidecar-selector would not reach it"
            )
    if capacity_ceilings and _CEILING.search(text):
        text = _with_ceilings(text, capacity_ceilings, source)
    if sidecar_selector == SIDECAR_SELECTOR:
        return text
    check_selector(sidecar_selector)
    out = _UP.sub(lambda _: f"up{{{sidecar_selector}}}", text)
    try:
        same = yaml.safe_load(out) == _replaced(yaml.safe_load(text), sidecar_selector)
    except yaml.YAMLError:
        same = False
    if not same:
        raise RenderError(
            f"{source}: --sidecar-selector {sidecar_selector!r} does not survive YAML "
            "unchanged in this file"
        )
    return out


def rule_files(rules_dir: Path = HERE) -> list[Path]:
    """The rule files: ``*.rules.yml`` in rules_dir (promtool's tests are in tests/)."""
    return sorted(rules_dir.glob("*.rules.yml"))


def rendered(
    rules_dir: Path = HERE,
    *,
    sidecar_selector: str = SIDECAR_SELECTOR,
    capacity_ceilings: dict[str, int] | None = None,
) -> dict[str, str]:
    """Each rule file's name and its rendered text."""
    texts = {path.name: path.read_text(encoding="utf-8") for path in rule_files(rules_dir)}
    if capacity_ceilings and not any(_CEILING.search(t) for t in texts.values()):
        # Ceilings nothing would read are a mistake to say, not to drop.
        raise RenderError(
            f"--capacity-ceiling: no rule file in {rules_dir} records {CEILING_RECORD} "
            f"as {NO_CEILING}"
        )
    return {
        name: render(
            text,
            sidecar_selector=sidecar_selector,
            capacity_ceilings=capacity_ceilings,
            source=name,
        )
        for name, text in texts.items()
    }


def add_selector_argument(parser: argparse.ArgumentParser) -> None:
    """``--sidecar-selector``, as both generators (this and deploy/generate.py) take it."""
    parser.add_argument(
        "--sidecar-selector",
        default=SIDECAR_SELECTOR,
        help="the matchers that select the sidecar's scrape job in up{...}; default: %(default)s",
    )


def add_ceiling_argument(parser: argparse.ArgumentParser) -> None:
    """``--capacity-ceiling MODEL=PODS``, repeatable, as both generators take it."""
    parser.add_argument(
        "--capacity-ceiling",
        action="append",
        default=[],
        metavar="MODEL=PODS",
        help="the pods the capacity runway of MODEL is measured against (a replica ceiling, "
        "a GPU quota); repeat per model; default: the pods running now",
    )


def ceilings(values: list[str]) -> dict[str, int]:
    """The --capacity-ceiling values as {model: pods}; a model given twice is refused."""
    out: dict[str, int] = {}
    for value in values:
        model, pods = parse_ceiling(value)
        if model in out:
            raise RenderError(f"--capacity-ceiling: {model!r} is given twice")
        out[model] = pods
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rules", type=Path, default=HERE, help="default: rules/")
    parser.add_argument("--out", type=Path, required=True, help="the folder to write them to")
    add_selector_argument(parser)
    add_ceiling_argument(parser)
    args = parser.parse_args(argv)
    try:
        files = rendered(
            args.rules,
            sidecar_selector=args.sidecar_selector,
            capacity_ceilings=ceilings(args.capacity_ceiling),
        )
    except RenderError as e:
        print(f"generate.py: {e}", file=sys.stderr)
        return 2
    if not files:
        print(f"generate.py: no *.rules.yml in {args.rules}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (args.out / name).write_text(text, encoding="utf-8")
    print(f"wrote {len(files)} rule files to {args.out}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
