"""``leasefs bench partition``: a short run on hosts of their own gives well-formed results
whose figures are what happened (the faults took effect, the times count from them, the
table says what the rounds measured), and its plain table says timeouts as lower bounds."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from hostkit import require_hosts
from tools.bench.partition import FAULTS, MEASURES, SCENARIOS, STORAGE, table_lines

ROUND_TIMEOUT = 12.0


def leasefs(*args, env=None, timeout=120):
    return subprocess.run([sys.executable, "-m", "tools", *map(str, args)], env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
def test_bench_partition_measures_each_fault_from_its_moment(tmp_path):
    """One round of each fault per scenario. Every kill round gets through; an HA
    active's successor cannot serve before the victim's etcd lease (the election timeout,
    renewed every third of it) has run out, so a write through it comes no sooner after
    either fault, kill or partition (had the cut missed, or the clock started late, writes
    would come in milliseconds); every acknowledged byte is read back; the summary is the
    rounds' figures and the table shows them."""
    require_hosts()
    env = {**os.environ, "LEASEFS_HOME": str(tmp_path)}
    run = leasefs("bench", "partition", "--rounds", "1", "--round-timeout", ROUND_TIMEOUT,
                  "--json", "--quiet", "--home", tmp_path, env=env, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    results = json.loads(run.stdout)
    rounds = results["rounds"]
    assert [(r["scenario"], r["fault"]) for r in rounds] == \
        [(s, f) for s in SCENARIOS for f in FAULTS]
    election = results["election_timeout"]
    for r in rounds:
        assert r["victim"] in (("meta0", "meta1") if r["scenario"] == "active" else STORAGE), r
        assert 0 <= r["applied_seconds"] < 5 and r["recovered_seconds"] >= 0, r
        for key, _ in MEASURES[r["scenario"]]:
            figure = r[key]
            if r["fault"] == "kill":
                assert figure is not None, r
            if figure is not None:
                assert 0 < figure <= ROUND_TIMEOUT + 5, r
                if r["scenario"] == "active":
                    # counted from the fault's start, when the victim lost etcd at the
                    # earliest: its lease was renewed at most a third of its TTL before
                    assert figure + r["applied_seconds"] >= election * 2 / 3, r
    # the cut-off active was watched; kill rounds have nothing to say of it
    cut = next(r for r in rounds if r["scenario"] == "active" and r["fault"] == "partition")
    assert isinstance(cut["still_active"], bool)
    assert all(r["still_active"] is None for r in rounds if r["fault"] == "kill")

    verified = results["verified"]
    assert set(verified) == set(SCENARIOS)
    for name, v in verified.items():
        assert v["lost_count"] == 0 and v["files"] > 0 and v["bytes"] > 0, (name, v)

    for r in rounds:
        for key, _ in MEASURES[r["scenario"]]:
            cell = results["summary"][f"{r['scenario']}.{key}"][r["fault"]]
            assert cell["rounds"] == 1
            assert cell["timed_out"] == (r[key] is None)
            assert cell["p50"] == cell["max"] == r[key]
    lines = table_lines(results)
    for row in results["summary"].values():
        line = next(x for x in lines if row["label"] in x)
        assert f"{row['kill']['p50']:.2f}" in line, (line, row)


def test_bench_partition_table_says_timeouts_as_lower_bounds():
    """A partition round that timed out is '>TIMEOUT' and its ratio a lower bound; the
    cut-off active that never stepped down, and lost bytes, are said."""
    def rnd(scenario, fault, seconds, **extra):
        return {"scenario": scenario, "fault": fault, "victim": "meta0", "seconds": seconds,
                "fresh_seconds": extra.get("fresh"), "applied_seconds": 0.05,
                "still_active": extra.get("still"), "stepped_down_seconds": None,
                "in_flight": seconds is not None and seconds > 30,
                "recovered_seconds": 1.0, "errors": [], "notes": []}
    from tools.bench.partition import Round, summary

    rounds = [rnd("active", "partition", None, fresh=5.0, still=True),
              rnd("active", "kill", 3.0, fresh=3.5),
              rnd("active", "partition", 31.0, fresh=6.0, still=True),
              rnd("active", "kill", 2.0, fresh=2.5)]
    results = {"hosts": 8, "rounds_per_fault": 2, "round_timeout": 40.0, "election_timeout": 3.0,
               "summary": summary([Round(**r) for r in rounds], 40.0), "rounds": rounds,
               "verified": {"active": {"files": 10, "bytes": 10240, "lost_count": 1,
                                       "lost": ["/x/s3"]}}}
    lines = table_lines(results)
    inflight = next(x for x in lines if "steady client" in x).split()
    # kill p50 2.00 (nearest rank), max 3.00; partition p50 31.00, max >40 (1 of 2 timed out)
    assert inflight[-6:] == ["2.00", "3.00", "31.00", ">40", "1/2", "15.5"], inflight
    fresh = next(x for x in lines if "fresh client" in x).split()
    assert fresh[-6:] == ["2.50", "3.50", "5.00", "6.00", "0/2", "2.0"], fresh
    assert any("still said 'active'" in x and "2 of 2" in x and "never" in x for x in lines)
    assert any("in flight at the fault in 1 of 4 round(s)" in x for x in lines)
    assert any(x.startswith("LOST: 1 file(s)") for x in lines)
    assert any("lost: /x/s3" in x for x in lines)

    results["rounds"] = rounds = [rnd("active", "partition", None, fresh=None, still=True),
                                  rnd("active", "kill", 2.0, fresh=2.0)]
    results["summary"] = summary([Round(**r) for r in rounds], 40.0)
    inflight = next(x for x in table_lines(results) if "steady client" in x).split()
    assert inflight[-6:] == ["2.00", "2.00", ">40", ">40", "1/1", ">20.0"], inflight


def test_bench_partition_refuses_bad_options():
    for args, said in ((["--rounds", "0"], "--rounds"), (["--read-size", "1G"], "--read-size"),
                       (["--round-timeout", "0"], "--round-timeout"),
                       (["--set", "nosuch=1"], "nosuch")):
        run = leasefs("bench", "partition", *args)
        assert run.returncode == 2 and said in run.stderr and "Traceback" not in run.stderr, \
            (args, run.stderr)
