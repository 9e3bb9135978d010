"""Partial reduce's group size P (and deadline): the standard scenario under each, repeated.

Each setting runs ``antdt bench --plans partial-reduce --repeat N`` on a
copy of the scenario with ``grouper.group_size`` (and ``deadline_ms``) set,
and reports the median, min and max of the wall time and of the time to the
scenario's target held-out loss, the final held-out loss, and how the
groups formed (by reason, mean size, member wait p50/p99). This is how the
grouper's default P was chosen. Exits 1 if any run failed.

    .venv/bin/python bench/preduce_bench.py --sizes 2,3,4 --repeat 3 --json
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import orjson
import yaml
from benchlib import bench_parser, emit, numbers

from antdt.demo.scenario import Scenario


def run_setting(scenario: Scenario, size: int, deadline_ms: float, repeat: int, out: Path) -> dict:
    data = scenario.model_dump(mode="json")
    data["grouper"] = {
        **data.get("grouper", {}),
        "group_size": str(size),
        "deadline_ms": f"{deadline_ms:g}",
    }
    path = out / f"scenario-p{size}-d{deadline_ms:g}.yaml"
    path.write_text(yaml.safe_dump(data))
    command = [
        sys.executable,
        "-m",
        "antdt.cli.main",
        "bench",
        "--scenario",
        str(path),
        "--plans",
        "partial-reduce",
        "--repeat",
        str(repeat),
        "--json",
        "--out",
        str(out / f"p{size}-d{deadline_ms:g}"),
    ]
    done = subprocess.run(command, capture_output=True, text=True)
    if not done.stdout.strip():
        return {
            "group_size": size,
            "deadline_ms": deadline_ms,
            "failures": [done.stderr.strip()[-500:]],
        }
    [plan] = orjson.loads(done.stdout)["plans"]
    runs = plan["runs"]
    return {
        "group_size": size,
        "deadline_ms": deadline_ms,
        "runs": len(runs),
        "reached_target": plan["reached_target"],
        **{
            f"{stat}_{key}": plan.get(f"{stat}_{key}")
            for key in ("wall_s", "time_to_target_s", "heldout_loss")
            for stat in ("median", "min", "max")
        },  # the spreads antdt bench already gives
        "groups": [
            {
                k: r["groups"][k]
                for k in ("by_reason", "mean_partial_size", "wait_ms_p50", "wait_ms_p99")
            }
            for r in runs
            if r.get("groups")
        ],
        "ledger_ok": all(r["ledger"]["ok"] for r in runs),
        "failures": plan["failures"],
    }


def main() -> None:
    parser = bench_parser(__doc__, "")
    parser.add_argument("--scenario", default="standard")
    parser.add_argument("--sizes", default="2,3,4", help="group sizes P to compare")
    parser.add_argument("--deadlines", default="50", help="grouper deadlines (ms) to compare")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    sizes, deadlines = (
        numbers(parser, "--sizes", args.sizes),
        numbers(parser, "--deadlines", args.deadlines, float),
    )
    from antdt.cli.demo_cmd import load_scenario

    scenario = load_scenario(args.scenario, None)
    out = Path(tempfile.mkdtemp(prefix="antdt-preduce-bench-"))
    rows = [
        run_setting(scenario, size, deadline, args.repeat, out)
        for size in sizes
        for deadline in deadlines
    ]
    emit(
        {
            "scenario": scenario.name,
            "target_loss": scenario.target_loss,
            "repeat": args.repeat,
            "settings": rows,
            "reports": str(out),
        },
        args.json,
    )
    if any(row["failures"] for row in rows):
        print(
            "failed: "
            + "; ".join(f"P={r['group_size']}: {r['failures']}" for r in rows if r["failures"]),
            file=sys.stderr,
        )
        sys.exit(1)


if __name__ == "__main__":
    main()
