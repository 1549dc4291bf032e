"""kv-cache-pressure.json: Pressure now and soon: usage, free tokens, time to exhaustion,
preemption risk and the forecast it rests on, waiting and preemptions."""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as dashboard_b
from grafana_foundation_sdk.models import common as common_m
from grafana_foundation_sdk.models import dashboard as dashboard_m

from dashboards.lib.frame import frame
from dashboards.lib.panels import stat, timeseries
from dashboards.lib.queries import (
    INFO,
    VLLM,
    Q,
    agg,
    named,
    ours,
    rate,
    sel,
    vllm_rate,
    with_model,
)
from exporter.risk.model import (
    ALERT_FOR_SECONDS,
    ALERT_THRESHOLD,
    ALERT_USAGE,
    EDGE_FOR_SECONDS,
    EDGE_THRESHOLD,
    HORIZON,
    WARNING_CERTAIN,
    WARNING_FOR_SECONDS,
    WARNING_THRESHOLD,
    WARNING_USAGE,
    WARNING_USAGE_WINDOW_SECONDS,
)

# One hour: far enough ahead to act on, and a finite stand-in for the sidecar's +Inf.
EXHAUSTION_CLAMP_SECONDS = 3600


def pressure() -> dashboard_m.Dashboard:
    exhaustion = (
        f"clamp_max({ours('min', 'kv_headroom_seconds_to_exhaustion')}, {EXHAUSTION_CLAMP_SECONDS})"
    )
    worst_exhaustion = (
        f"min(clamp_max(min by (job, instance) "
        f"({sel('kv_headroom_seconds_to_exhaustion')}), {EXHAUSTION_CLAMP_SECONDS}) "
        f"* on (job, instance) group_left () {INFO})"
    )
    worst_risk = (
        f"max(max by (job, instance) ({sel('kv_headroom_preemption_risk')}) "
        f"* on (job, instance) group_left () {INFO})"
    )
    not_on_trend = dashboard_m.RangeMap(
        options=dashboard_m.DashboardRangeMapOptions(
            from_val=EXHAUSTION_CLAMP_SECONDS,
            to=EXHAUSTION_CLAMP_SECONDS,
            result=dashboard_m.ValueMappingResult(text="> 1 h / not on this trend", color="green"),
        )
    )
    risk_steps = ((None, "green"), (WARNING_THRESHOLD, "orange"), (ALERT_THRESHOLD, "red"))
    exhaustion_steps = ((None, "red"), (60, "orange"), (180, "green"))
    running = named(agg("sum", sel("vllm:num_requests_running", base=VLLM)))
    return (
        frame(
            "KV cache pressure",
            "kv-headroom-pressure",
            "Is a vLLM about to run out of KV cache and preempt? Usage against capacity, "
            "free room, the queue, the preemption-risk score and its alert threshold, and "
            "throughput against the running batch.",
        )
        .with_row(dashboard_b.Row("Risk"))
        .with_panel(
            stat(
                "Highest preemption risk",
                f"The highest preemption-risk score among the selected pods. Above "
                f"{WARNING_THRESHOLD} with the cache over {WARNING_USAGE:.0%} full within the "
                f"last {WARNING_USAGE_WINDOW_SECONDS:g} s, or above {WARNING_CERTAIN}, for "
                f"{WARNING_FOR_SECONDS:g} s the warning fires; above "
                f"{ALERT_THRESHOLD} with the cache over {ALERT_USAGE:.0%} full within the last "
                f"minute, for {ALERT_FOR_SECONDS:g} s, the page: the risk panel shows which pod.",
                "short",
                [Q(worst_risk, "worst")],
                thresholds=risk_steps,
                decimals=2,
            )
        )
        .with_panel(
            stat(
                "Shortest time to exhaustion",
                "The soonest any selected pod's forecast KV level (the one its risk score "
                "rests on) crosses the capacity. Shown as '> 1 h / not on this trend' when "
                "the forecast never reaches the top (the sidecar exports +Inf, clamped here "
                "to one hour).",
                "s",
                [Q(worst_exhaustion, "soonest")],
                thresholds=exhaustion_steps,
                mappings=(not_on_trend,),
            )
        )
        .with_panel(
            stat(
                "Preemptions in the range",
                "Preemptions across the selected pods over the dashboard's time range. "
                "Each one throws away a sequence's KV cache and recomputes it: wasted GPU "
                "time and a latency spike for that request.",
                "short",
                [
                    Q(
                        "sum("
                        + with_model(
                            agg(
                                "sum", f"increase({sel('kv_headroom_preemptions_total')}[$__range])"
                            )
                        )
                        + ")",
                        "preemptions",
                        instant=True,
                    )
                ],
                thresholds=((None, "green"), (1, "red")),
                decimals=0,
            )
        )
        .with_panel(
            stat(
                "Requests waiting",
                "Requests in vLLM's queue across the selected pods. A queue that persists "
                "while KV usage is high means the cache, not compute, limits throughput.",
                "short",
                [Q(f"sum({ours('sum', 'kv_headroom_requests_waiting')})", "waiting")],
                thresholds=((None, "green"), (1, "orange")),
                decimals=0,
            )
        )
        .with_panel(
            timeseries(
                "Preemption risk",
                f"Score 0–1 that vLLM preempts within about three minutes: forecast KV "
                f"level (trend and waiting prompts) against capacity, capped by what "
                f"max_num_seqs allows, and the running batch's overcommit. Orange from the "
                f"warning ({WARNING_THRESHOLD}, with the cache over {WARNING_USAGE:.0%} full "
                f"within {WARNING_USAGE_WINDOW_SECONDS:g} s, or above {WARNING_CERTAIN}), red "
                f"from the page ({ALERT_THRESHOLD}, with "
                f"the cache over {ALERT_USAGE:.0%} full within a minute). Above them: shed "
                f"or reroute load, lower --max-num-seqs, or add KV memory. 'calibrated': how "
                f"often, on this pod since vLLM last restarted, a score in the same band was "
                f"followed by a preemption within three minutes.",
                "short",
                [
                    Q(ours("max", "kv_headroom_preemption_risk")),
                    Q(ours("max", "kv_headroom_preemption_probability"), "{{target}} calibrated"),
                ],
                span=8,
                max_val=1,
                thresholds=risk_steps,
                threshold_style=common_m.GraphThresholdsStyleMode.LINE,
            )
        )
        .with_panel(
            timeseries(
                "Forecast KV usage",
                f"The KV level the risk forecasts {HORIZON / 60:g} minutes ahead ÷ the "
                f"capacity: what the risk score and the time to exhaustion rest on. Above 1 "
                f"it overflows and the risk pages. Above {EDGE_THRESHOLD:g} (the line) for "
                f"{EDGE_FOR_SECONDS / 60:g} minutes without overflowing, the "
                f"VllmKvCacheRunningAtEdge ticket opens: the server runs near full — add KV "
                f"memory or a replica within a working day.",
                "percentunit",
                [Q(ours("max", "kv_headroom_forecast_usage_ratio"))],
                span=8,
                thresholds=((None, "green"), (EDGE_THRESHOLD, "orange")),
                threshold_style=common_m.GraphThresholdsStyleMode.LINE,
            )
        )
        .with_panel(
            timeseries(
                "Time to KV exhaustion",
                "When the forecast KV level the risk rests on crosses the capacity: from the "
                "occupancy now to the level three minutes ahead, then along the trend. The "
                "sidecar exports +Inf when that forecast never reaches the top (not on this "
                "trend); here that is clamped to one hour, so the top of the axis means 'not "
                "in sight'. Minutes or less means the cache fills before the running "
                "requests finish.",
                "s",
                [Q(exhaustion)],
                span=8,
                max_val=EXHAUSTION_CLAMP_SECONDS,
                thresholds=exhaustion_steps,
                threshold_style=common_m.GraphThresholdsStyleMode.DASHED,
            )
        )
        .with_panel(
            timeseries(
                "Running batch overcommit",
                "The tokens the running sequences are still expected to add ÷ the free KV "
                "tokens. Above 1 (the line) the batch in hand does not fit as it grows: vLLM "
                "will preempt unless requests finish early.",
                "short",
                [Q(ours("max", "kv_headroom_overcommit_ratio"))],
                thresholds=((None, "green"), (1, "red")),
                threshold_style=common_m.GraphThresholdsStyleMode.LINE,
            )
        )
        .with_panel(
            timeseries(
                "Preemptions per minute",
                "Preemptions vLLM reported, per minute (the sidecar's counter survives vLLM "
                "restarts). vLLM counts a preemption when the request runs again, so this "
                "lags the moment the cache ran out.",
                "short",
                [Q(named(with_model("60 * " + agg("sum", rate("kv_headroom_preemptions_total")))))],
            )
        )
        .with_row(dashboard_b.Row("KV cache"))
        .with_panel(
            timeseries(
                "KV cache usage",
                "Share of KV blocks held by live requests (vLLM's kv_cache_usage_perc; the "
                "worst data-parallel engine). vLLM is built to run its cache full, so a high "
                "value alone is fine: the danger is running out of room to grow — see the "
                "risk and overcommit panels.",
                "percentunit",
                [Q(ours("max", "kv_headroom_kv_usage_ratio"))],
                span=8,
                max_val=1,
            )
        )
        .with_panel(
            timeseries(
                "KV tokens: used, committed, capacity",
                "KV tokens held now, held plus what the running sequences are still expected "
                "to add, and the capacity. When 'used + committed' crosses the capacity, the "
                "running batch will not fit as it grows.",
                "short",
                [
                    Q(ours("sum", "kv_headroom_kv_used_tokens"), "{{target}} used"),
                    Q(
                        named(
                            with_model(
                                agg("sum", sel("kv_headroom_kv_used_tokens"))
                                + " + "
                                + agg("sum", sel("kv_headroom_committed_tokens"))
                            )
                        ),
                        "{{target}} used + committed",
                    ),
                    Q(
                        ours("sum", "kv_headroom_kv_capacity_tokens", 'source="observed"'),
                        "{{target}} capacity",
                    ),
                ],
                span=8,
            )
        )
        .with_panel(
            timeseries(
                "Free KV room",
                "KV tokens free now, and how many more sequences of today's p95 context "
                "still fit in them. Zero sequences at p95 means the next long request waits "
                "or displaces a running one.",
                "short",
                [
                    Q(ours("sum", "kv_headroom_kv_free_tokens"), "{{target}} free tokens"),
                    Q(
                        ours("sum", "kv_headroom_free_sequences", 'context="p95"'),
                        "{{target}} p95 sequences",
                    ),
                ],
                span=8,
                right_axis=(("B", "short"),),
            )
        )
        .with_row(dashboard_b.Row("Requests"))
        .with_panel(
            timeseries(
                "Requests running and waiting",
                "The running batch, the queue, and the part of the queue waiting for "
                "scheduling capacity (vLLM 0.20+). A growing queue with a full cache: add "
                "replicas or KV memory.",
                "short",
                [
                    Q(ours("sum", "kv_headroom_requests_running"), "{{target}} running"),
                    Q(ours("sum", "kv_headroom_requests_waiting"), "{{target}} waiting"),
                    Q(
                        ours("sum", "kv_headroom_requests_waiting_for_capacity"),
                        "{{target}} waiting for capacity",
                    ),
                ],
            )
        )
        .with_panel(
            timeseries(
                "Running requests vs what fits",
                "The running batch against the sequences that fit at the p50 and p95 "
                "context. Running above the p95 line is where preemptions start when long "
                "requests arrive together.",
                "short",
                [
                    Q(ours("sum", "kv_headroom_requests_running"), "{{target}} running"),
                    Q(
                        ours(
                            "sum",
                            "kv_headroom_max_sequences",
                            'context=~"p50|p95"',
                            by=("context",),
                        ),
                        "{{target}} fit at {{context}}",
                    ),
                ],
            )
        )
        .with_row(dashboard_b.Row("Throughput"))
        .with_panel(
            timeseries(
                "Requests per second vs running",
                "Requests vLLM finished per second (left axis) against its running batch "
                "(right axis). Flat throughput while the batch grows means each request "
                "takes longer: the server is saturated.",
                "reqps",
                [
                    Q(vllm_rate("vllm:request_success_total"), "{{target}} finished/s"),
                    Q(running, "{{target}} running"),
                ],
                right_axis=(("B", "short"),),
            )
        )
        .with_panel(
            timeseries(
                "Tokens per second vs running",
                "Prompt tokens prefilled and tokens generated per second (left axis) against "
                "the running batch (right axis). Generation per running request falling "
                "as the batch grows is the latency cost of a bigger batch.",
                "short",
                [
                    Q(vllm_rate("vllm:prompt_tokens_total"), "{{target}} prompt tokens/s"),
                    Q(
                        vllm_rate("vllm:generation_tokens_total"),
                        "{{target}} generated tokens/s",
                    ),
                    Q(running, "{{target}} running"),
                ],
                right_axis=(("C", "short"),),
            )
        )
        .build()
    )
