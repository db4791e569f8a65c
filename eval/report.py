"""Human-readable views of a results file: Markdown table, bar chart, HTML report; comparison.

``write_reports(results)`` writes, next to ``results.json``:

* ``results.md``: per-task success with Wilson 95% intervals and the suite average;
* ``results.png``: bar chart of per-task success with the intervals as error bars (matplotlib,
  Agg backend, imported only here);
* ``results.html``: the header, the table, and every recorded video in a ``<video>`` tag whose
  ``src`` is relative, so the report opens in a browser from the output directory.

:func:`compare` pairs two results files on their shared (task, trial) pairs: per-task
differences and McNemar's test (:func:`rlinf_embodied.eval.stats.mcnemar`).
"""

from __future__ import annotations

import html
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple, Union

from rlinf_embodied.eval.results import Episode, ResultsFile, env_config_differences, summarize
from rlinf_embodied.eval.stats import McNemarResult, mcnemar

__all__ = [
    "markdown_table",
    "bar_chart",
    "html_report",
    "write_reports",
    "Comparison",
    "CompareError",
    "compare",
    "format_comparison",
]


def _pct(x: float) -> str:
    return f"{100.0 * x:.1f}"


def _title(results: ResultsFile) -> str:
    h = results.header
    where = h.get("suite") or h.get("env_id") or h.get("env", "")
    proto = (h.get("protocol") or {}).get("id", "?")
    pol = h.get("policy") or {}
    src = pol.get("source", "?")
    if pol.get("checkpoint"):  # a run directory: which checkpoint (--checkpoint latest / best)
        it = pol.get("iteration")
        src += f" ({pol['checkpoint']} checkpoint" + (f", iteration {it})" if it is not None else ")")
    return f"{where} | protocol {proto} | policy {src}"


def markdown_table(results: ResultsFile) -> str:
    """Per-task success table (Markdown) with Wilson 95% intervals and the suite average.

    Columns: task, instruction, episodes, success %, 95% CI, errors (and success-at-end % for
    ManiSkill fair evaluation). The last rows are the mean of per-task rates (the published
    "average") and the pooled rate over all episodes.
    """
    s = summarize(results.episodes)
    at_end = any("success_at_end_rate" in v for v in s["per_task"].values())
    returns = _scores_returns(results, s)
    cols = ["task", "instruction", "episodes", "success %", "95% CI", "errors"]
    if at_end:
        cols.insert(4, "success at end %")
    if returns:
        cols.insert(3, "mean return [95% CI]")
    lines = [f"**{_title(results)}**", "", "| " + " | ".join(cols) + " |",
             "|" + "|".join("---" for _ in cols) + "|"]

    def row(name: str, instr: str, v: Dict[str, Any]) -> str:
        cells = [name, instr, str(v["episodes"]), _pct(v["rate"]),
                 f"[{_pct(v['ci95'][0])}, {_pct(v['ci95'][1])}]", str(v["errors"])]
        if at_end:
            cells.insert(4, _pct(v["success_at_end_rate"]) if "success_at_end_rate" in v else "")
        if returns:
            cells.insert(3, (f"{v['mean_return']:.4g} [{v['return_ci95'][0]:.4g}, "
                             f"{v['return_ci95'][1]:.4g}]") if "mean_return" in v else "")
        return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"

    for key, v in s["per_task"].items():  # a gym task's "instruction" is its env id: left blank
        lines.append(row(key, "" if v.get("instruction") == key else v.get("instruction") or "", v))
    o = s["overall"]
    lines.append(f"| **average** | mean of {o['tasks']} task rates | {o['episodes']} | "
                 + ("| " if returns else "")
                 + f"**{_pct(o['task_mean'])}** | | |" + (" |" if at_end else ""))
    lines.append(row("pooled", "all episodes", o))
    mism = results.header.get("version_mismatches") or []
    if mism:
        lines += ["", "Simulator versions differ from the protocol: " + "; ".join(mism)]
    return "\n".join(lines) + "\n"


def _scores_returns(results: ResultsFile, s: Dict[str, Any]) -> bool:
    """Whether episode returns are shown: gymnasium envs (many report no ``info["success"]``,
    e.g. CartPole, Pendulum, so their success rate is 0 whatever the policy does)."""
    return results.header.get("env") == "gym" and any(
        "mean_return" in v for v in s["per_task"].values())


def bar_chart(results: ResultsFile, path: Union[str, os.PathLike]) -> Path:
    """Bar chart PNG of per-task success with Wilson 95% error bars (gymnasium envs: mean
    episode return with Student-t 95% error bars).

    Returns:
        The written path.
    """
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    s = summarize(results.episodes)
    names = list(s["per_task"])
    entries = list(s["per_task"].values())
    if _scores_returns(results, s):
        values = [v.get("mean_return", 0.0) for v in entries]
        bounds = [v.get("return_ci95", [x, x]) for v, x in zip(entries, values)]
        ylabel, average = "mean episode return (t 95% CI)", None
    else:
        values = [100 * v["rate"] for v in entries]
        bounds = [[100 * v["ci95"][0], 100 * v["ci95"][1]] for v in entries]
        ylabel, average = "success % (Wilson 95% CI)", s["overall"]["task_mean"]
    # Error bar lengths, never negative (float noise where an interval ends at the value).
    lows = [max(0.0, x - b[0]) for x, b in zip(values, bounds)]
    highs = [max(0.0, b[1] - x) for x, b in zip(values, bounds)]
    fig, ax = plt.subplots(figsize=(max(4.0, 0.5 * len(names) + 2), 3.5))
    try:
        ax.bar(range(len(names)), values, yerr=[lows, highs], capsize=3, color="#4878a8")
        if average is not None:
            ax.axhline(100 * average, color="#c44e52", ls="--", label=f"average {_pct(average)}%")
            ax.set_ylim(0, 105)
            ax.legend(loc="lower right", fontsize=8)
        ax.set_xticks(range(len(names)))
        ax.set_xticklabels(names, rotation=90 if len(names) > 12 else 0)
        ax.set_xlabel("task")
        ax.set_ylabel(ylabel)
        ax.set_title(_title(results), fontsize=8)
        fig.tight_layout()
        path = Path(path)
        fig.savefig(path, dpi=100)
    finally:
        plt.close(fig)
    return path


def _md_to_html_table(md: str) -> str:
    """The Markdown table of :func:`markdown_table` as an HTML table (cells escaped)."""
    rows = [ln for ln in md.splitlines() if ln.startswith("|") and not ln.startswith("|---")]
    out = ["<table>"]
    for i, ln in enumerate(rows):
        tag = "th" if i == 0 else "td"
        # split on unescaped pipes: empty cells are "| |", not " |  | "
        cells = [c.strip().replace("\\|", "|").replace("**", "")
                 for c in re.split(r"(?<!\\)\|", ln.strip()[1:-1])]
        out.append("<tr>" + "".join(f"<{tag}>{html.escape(c)}</{tag}>" for c in cells) + "</tr>")
    out.append("</table>")
    return "\n".join(out)


def html_report(results: ResultsFile, path: Union[str, os.PathLike],
                chart: Optional[Union[str, os.PathLike]] = None) -> Path:
    """A self-contained HTML page: header, table, chart, and one ``<video>`` per recorded
    episode (``src`` relative to the page, so keep the page beside the results file).

    Returns:
        The written path.
    """
    path = Path(path)
    h = results.header
    proto = h.get("protocol") or {}
    policy = h.get("policy") or {}
    facts = [
        ("protocol", f"{proto.get('id')} (fingerprint {proto.get('fingerprint')})"),
        ("env", f"{h.get('env')} {h.get('suite') or h.get('env_id') or ''}"),
        ("policy", f"{policy.get('source')} [{policy.get('kind')}] sha256 "
                   f"{str(policy.get('sha256'))[:16]}"),
        ("execution per query", ", ".join(f"{k} {v}" for k, v in (h.get("execution") or {}).items()
                                          if k != "preprocessing") or "not recorded"),
        ("image preprocessing", str((h.get("execution") or {}).get("preprocessing", "n/a"))),
        ("seeds", str(h.get("seeds"))),
        ("versions", ", ".join(f"{k} {v}" for k, v in (h.get("versions") or {}).items())),
        ("render backend / device", f"{h.get('render_backend')} / {h.get('device')}"),
        ("batch-invariant policy", {True: "yes (one forward per env row)",
                                    False: "no (batched forward)"}.get(h.get("batch_invariant"),
                                                                       "not recorded")),
        ("version mismatches", "; ".join(h.get("version_mismatches") or []) or "none"),
        ("started", f"{h.get('started_at')} (resumed: {h.get('resumed_at') or 'no'})"),
    ]
    body = [
        "<!DOCTYPE html>",
        "<html><head><meta charset=\"utf-8\">",
        f"<title>{html.escape(_title(results))}</title>",
        "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:3px 8px;text-align:left}"
        ".vid{display:inline-block;margin:4px;font-size:12px}</style>",
        "</head><body>",
        f"<h1>{html.escape(_title(results))}</h1>",
        "<table>" + "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>"
                            for k, v in facts) + "</table>",
        "<h2>Success per task</h2>",
        _md_to_html_table(markdown_table(results)),
    ]
    if chart is not None:
        rel = os.path.relpath(chart, path.parent)
        body.append(f"<p><img src=\"{html.escape(rel)}\" alt=\"success per task\"></p>")
    videos = [e for e in results.episodes if e.video]
    if videos:
        body.append("<h2>Videos</h2>")
        for e in sorted(videos, key=lambda e: (str(e.task), e.trial)):
            label = (f"task {e.task} trial {e.trial}: {'success' if e.success else 'failure'}"
                     + (f" ({e.error})" if e.error else ""))
            body.append(
                f"<div class=\"vid\"><video src=\"{html.escape(e.video)}\" width=\"256\" "
                f"controls muted preload=\"metadata\"></video><br>{html.escape(label)}</div>"
            )
    errors = [e for e in results.episodes if e.error]
    if errors:
        body.append("<h2>Episodes that raised</h2><ul>")
        body += [f"<li>task {e.task} trial {e.trial}: {html.escape(e.error)}</li>" for e in errors]
        body.append("</ul>")
    body.append("</body></html>")
    from rlinf_embodied.checkpoint import atomic_write_text

    return atomic_write_text(path, "\n".join(body) + "\n")


def write_reports(results: Union[ResultsFile, str, os.PathLike]) -> Dict[str, Path]:
    """Write ``.md``, ``.png`` and ``.html`` beside the results file.

    Args:
        results: a :class:`ResultsFile` or the path of one.

    Returns:
        ``{"markdown": ..., "chart": ..., "html": ...}`` paths.

    Raises:
        ResultsError: if a path is given that is not a readable results file.
    """
    from rlinf_embodied.checkpoint import atomic_write_text

    if not isinstance(results, ResultsFile):
        results = ResultsFile.load(results)
    stem = results.path.with_suffix("")
    md = atomic_write_text(stem.with_suffix(".md"), markdown_table(results))
    png = bar_chart(results, stem.with_suffix(".png"))
    page = html_report(results, stem.with_suffix(".html"), chart=png)
    return {"markdown": md, "chart": png, "html": page}


# --------------------------------------------------------------------------------------------
# Comparison
# --------------------------------------------------------------------------------------------
class CompareError(ValueError):
    """Two results files cannot be compared; the message says why and how to override."""


@dataclass
class Comparison:
    """Paired comparison of results A and B over their shared (task, trial) pairs.

    Attributes:
        per_task: task -> {"pairs", "a_rate", "b_rate", "diff" (b - a), "mcnemar"}.
        overall: the same over all shared pairs.
        only_a: pairs only A ran; only_b: pairs only B ran.
        warnings: reasons the comparison may be unfair (forced protocol mismatch, versions).
    """

    a: str
    b: str
    per_task: Dict[str, Dict[str, Any]]
    overall: Dict[str, Any]
    only_a: int
    only_b: int
    warnings: List[str] = field(default_factory=list)

    def to_dict(self) -> Dict[str, Any]:
        """JSON-ready view."""
        def plain(d):
            return {k: (v.to_dict() if isinstance(v, McNemarResult) else v) for k, v in d.items()}

        return {"a": self.a, "b": self.b, "per_task": {k: plain(v) for k, v in self.per_task.items()},
                "overall": plain(self.overall), "only_a": self.only_a, "only_b": self.only_b,
                "warnings": self.warnings}


def _paired(a: List[Episode], b: List[Episode]) -> Dict[str, Any]:
    n = len(a)
    sa = [bool(e.success) for e in a]
    sb = [bool(e.success) for e in b]
    b_cnt = sum(x and not y for x, y in zip(sa, sb))  # A succeeded, B failed
    c_cnt = sum(y and not x for x, y in zip(sa, sb))  # A failed, B succeeded
    ra, rb = (sum(sa) / n, sum(sb) / n) if n else (0.0, 0.0)
    return {"pairs": n, "a_rate": ra, "b_rate": rb, "diff": rb - ra,
            "mcnemar": mcnemar(b_cnt, c_cnt)}


PROTOCOL_FLAGS = {"max_steps": "--max-steps", "num_settle_steps": "--num-settle-steps",
                  "image_size": "--image-size"}
"""Protocol fields an evaluation overrides with an ``eval`` flag (the protocol id gets
``+field``); two results of one protocol that differ only in these pair after a re-run with the
other's flags."""


def _protocol_flag_advice(pa: dict, pb: dict, diff: list, name_a: str, name_b: str) -> str:
    """The re-run that makes two results of the same protocol comparable, as ``eval`` flags
    (with a value, or without the flag where one result used the protocol's own value); ""
    when they are different protocols or a differing value has no single flag."""
    if pa.get("name") is None or pa.get("name") != pb.get("name") or not diff:
        return ""
    if not set(diff) <= set(PROTOCOL_FLAGS):
        return ""

    def flags(p: dict) -> str | None:
        out = []
        for key in diff:
            v = p.get(key)
            if isinstance(v, dict):  # max_steps per task / suite: one flag sets them all
                if len(set(v.values())) > 1:
                    return None
                v = next(iter(v.values()), None)
            # unset: the protocol's or env's own value, which the flag's absence gives
            out.append(f"without {PROTOCOL_FLAGS[key]}" if v is None else f"with {PROTOCOL_FLAGS[key]} {v}")
        return " and ".join(out)

    fa, fb = flags(pa), flags(pb)
    if fa is None or fb is None:
        return ""
    return (f"Both are {pa['name']} with other {', '.join(diff)}: re-run the evaluation of "
            f"{name_b} {fa} (as {name_a}) or that of {name_a} {fb} (as {name_b}) into a new "
            "-o file, or pass --force to compare anyway.")


def compare(a: Union[ResultsFile, str, os.PathLike], b: Union[ResultsFile, str, os.PathLike],
            force: bool = False) -> Comparison:
    """Per-task differences and McNemar's test of B against A on shared (task, trial) pairs.

    Args:
        a: baseline results (file or path).
        b: results compared with the baseline.
        force: compare even if protocol, env or suite differ (recorded in ``warnings``).

    Returns:
        A :class:`Comparison`.

    Raises:
        ResultsError: a path that is not a readable results file.
        CompareError: different protocols (id or fingerprint), env, suite or task-defining
            env settings (:data:`TASK_ENV_SETTINGS`) without ``force``, or no shared (task,
            trial) pairs. Other differing env settings are listed in ``warnings``.
    """
    a = a if isinstance(a, ResultsFile) else ResultsFile.load(a)
    b = b if isinstance(b, ResultsFile) else ResultsFile.load(b)
    problems = []
    advice = ("Success rates under different protocols are not comparable (max steps, settle "
              "steps, trials and seeds differ); re-run one evaluation with the other's "
              "--protocol, or pass --force to compare anyway.")
    pa, pb = a.header.get("protocol") or {}, b.header.get("protocol") or {}
    if pa.get("id") != pb.get("id") or pa.get("fingerprint") != pb.get("fingerprint"):
        diff = sorted(k for k in set(pa) | set(pb)
                      if k not in ("id", "fingerprint", "trials_per_task", "overrides")
                      and pa.get(k) != pb.get(k))
        # results written before policy_mode existed acted greedily
        ma, mb = pa.get("policy_mode", "greedy"), pb.get("policy_mode", "greedy")
        if ma != mb and set(diff) <= {"policy_mode"}:
            problems.append(f"they took different actions, policy_mode {ma} ({a.path.name}) vs "
                            f"{mb} ({b.path.name}), under otherwise the same protocol")
            advice = ("A policy's success with sampled actions is not its greedy success; "
                      f"re-run one evaluation with the other's --policy-mode ({ma} or {mb}), "
                      "or pass --force to compare anyway.")
        else:
            flags = _protocol_flag_advice(pa, pb, diff, a.path.name, b.path.name)
            if flags:
                advice = flags
            problems.append(
                f"different protocols: {pa.get('id')} (fingerprint {pa.get('fingerprint')}) vs "
                f"{pb.get('id')} (fingerprint {pb.get('fingerprint')}); differing fields: "
                f"{', '.join(diff) or 'none listed'}"
                + (f" (policy_mode {ma} vs {mb})" if ma != mb else "")
            )
    other_task = [k for k in ("env", "suite", "env_id") if a.header.get(k) != b.header.get(k)]
    for key in other_task:
        problems.append(f"different {key}: {a.header.get(key)!r} vs {b.header.get(key)!r}")
    task_diffs, setup_diffs = env_config_differences(a.header.get("env_config"), b.header.get("env_config"))
    if task_diffs:
        problems.append("different env settings (the task itself): " + "; ".join(task_diffs))
        advice = ("Success under other env constructor arguments is success at another task; "
                  "re-run one evaluation with the other's --env-override, or pass --force to "
                  "compare anyway.")
    if other_task:  # another task altogether: no protocol flag makes the trials pair
        advice = ("The paired test compares two policies on the same trials of the same task; "
                  "evaluate both with the same --env and --task (or --suite), or pass --force "
                  "to compare anyway.")
    if problems and not force:
        raise CompareError(
            f"Refusing to compare {a.path} and {b.path}: " + "; ".join(problems) + ". " + advice
        )
    warnings = [f"forced: {p}" for p in problems]
    if a.path.resolve() == b.path.resolve():
        warnings.append(f"A and B are the same file ({a.path}): every pair agrees by construction.")
    if setup_diffs:
        warnings.append("the policies ran with different env settings (same task, another "
                        "observation, controller or episode rule): " + "; ".join(setup_diffs))
    va, vb = a.header.get("versions") or {}, b.header.get("versions") or {}
    for pkg in sorted(set(va) & set(vb)):
        if va[pkg] != vb[pkg] and pkg in ("mujoco", "robosuite", "mani-skill", "sapien"):
            warnings.append(f"{pkg} differs: {va[pkg]} vs {vb[pkg]}")
    for f in (a, b):  # an interrupted evaluation: its missing pairs are not compared
        planned = len(f.header.get("tasks") or []) * int(f.header.get("trials_per_task") or 0)
        if len(f.episodes) < planned:
            warnings.append(
                f"{f.path} is unfinished: {len(f.episodes)} of {planned} episodes "
                f"({len(f.header['tasks'])} tasks x {f.header['trials_per_task']} trials); "
                "run its eval command again to finish it (it resumes).")
    ea, eb = {e.key: e for e in a.episodes}, {e.key: e for e in b.episodes}
    shared = sorted(set(ea) & set(eb), key=lambda k: (str(k[0]), k[1]))
    if not shared:
        raise CompareError(
            f"{a.path} and {b.path} share no (task, trial) pairs; evaluate the same --tasks and "
            "trials."
        )
    tasks: Dict[Any, List[Tuple[Episode, Episode]]] = {}
    for k in shared:
        tasks.setdefault(k[0], []).append((ea[k], eb[k]))
    per_task = {
        str(t): _paired([x for x, _ in pairs], [y for _, y in pairs])
        for t, pairs in sorted(tasks.items(), key=lambda kv: (isinstance(kv[0], str), kv[0]))
    }
    overall = _paired([ea[k] for k in shared], [eb[k] for k in shared])
    return Comparison(str(a.path), str(b.path), per_task, overall,
                      only_a=len(set(ea) - set(eb)), only_b=len(set(eb) - set(ea)),
                      warnings=warnings)


def format_comparison(c: Comparison) -> str:
    """Markdown table of a :class:`Comparison` with the paired test per task and overall."""
    lines = [f"A = {c.a}", f"B = {c.b}", "",
             "| task | pairs | A % | B % | B - A (pp) | A only ok | B only ok | McNemar p |",
             "|---|---|---|---|---|---|---|---|"]

    def row(name: str, v: Dict[str, Any]) -> str:
        m: McNemarResult = v["mcnemar"]
        return (f"| {name} | {v['pairs']} | {_pct(v['a_rate'])} | {_pct(v['b_rate'])} | "
                f"{100 * v['diff']:+.1f} | {m.b} | {m.c} | {m.p_value:.3g} ({m.method}) |")

    lines += [row(k, v) for k, v in c.per_task.items()]
    lines.append(row("**all**", c.overall))
    if c.only_a or c.only_b:
        lines.append("")
        lines.append(f"Not paired (ignored): {c.only_a} episodes only in A, {c.only_b} only in B.")
    for w in c.warnings:
        lines.append(f"WARNING: {w}")
    return "\n".join(lines) + "\n"
