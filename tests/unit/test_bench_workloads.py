"""The pure parts of bench/bench_workloads.py: reading the MPI program's and hpcc's output,
the goals table, the whiteouts of the HPC layer."""

from __future__ import annotations

import pytest
from bench.bench_workloads import (
    GOALS,
    HPCC_INPUT,
    HPL_N,
    parse_figures,
    parse_hpcc,
    ratio_lines,
    whiteouts,
)

MPI_OUT = """\
figure latency_us 41.250
figure bandwidth_MBps 1203.4
figure allreduce_8B_us 88.001
figure allreduce_1MiB_us 2101.7
figure host wlbench-0
"""

HPCC_OUT = """\
noise before
Begin of Summary section.
HPL_Tflops=0.00612345
StarDGEMM_Gflops=7.5
Success=1
End of Summary section.
"""


def test_figures_are_read_and_the_host_name_is_not_a_number() -> None:
    assert parse_figures(MPI_OUT) == {
        "latency_us": 41.25,
        "bandwidth_MBps": 1203.4,
        "allreduce_8B_us": 88.001,
        "allreduce_1MiB_us": 2101.7,
    }


def test_a_missing_figure_is_an_error_naming_it() -> None:
    with pytest.raises(ValueError, match="bandwidth_MBps"):
        parse_figures(MPI_OUT.replace("figure bandwidth_MBps 1203.4\n", ""))


def test_hpcc_summary_gives_gflops() -> None:
    got = parse_hpcc(HPCC_OUT)
    assert got["hpl_gflops"] == pytest.approx(6.12345)
    assert got["stardgemm_gflops"] == 7.5


def test_hpcc_without_success_is_an_error() -> None:
    with pytest.raises(ValueError, match="Success='0'"):
        parse_hpcc(HPCC_OUT.replace("Success=1", "Success=0"))
    with pytest.raises(ValueError, match="Success=None"):
        parse_hpcc("nothing here")
    with pytest.raises(ValueError, match="StarDGEMM_Gflops"):
        parse_hpcc(HPCC_OUT.replace("StarDGEMM_Gflops=7.5\n", ""))


def test_ratio_lines_judge_each_goal_in_its_direction() -> None:
    pods = {
        "hpl_gflops": [9.4, 9.6, 9.5],  # 0.95 of the host: met
        "stardgemm_gflops": [5.0],  # 0.5: not met
        "latency_us": [60.0, 59.0, 61.0],  # 1.5x: met
        "bandwidth_MBps": [700.0],  # 0.7x: not met
        "allreduce_8B_us": [200.0],  # 2x: not met
    }
    host = {
        "hpl_gflops": [10.0, 10.0, 10.0],
        "stardgemm_gflops": [10.0],
        "latency_us": [40.0, 40.0, 40.0],
        "bandwidth_MBps": [1000.0],
        "allreduce_8B_us": [100.0],
        "allreduce_1MiB_us": [1.0],
    }
    lines = {line.split()[0]: line for line in ratio_lines(pods, host)[1:]}
    assert len(lines) == len(GOALS)
    assert lines["hpl_gflops"].endswith(": met") and " 0.95 " in lines["hpl_gflops"]
    assert lines["stardgemm_gflops"].endswith("NOT met")
    assert lines["latency_us"].endswith(": met") and " 1.50 " in lines["latency_us"]
    assert lines["bandwidth_MBps"].endswith("NOT met")
    assert lines["allreduce_8B_us"].endswith("NOT met")
    assert lines["allreduce_1MiB_us"].endswith("not measured")


def test_whiteouts_delete_files_and_empty_opaque_directories() -> None:
    deleted, emptied = whiteouts(
        [
            "./etc/openmpi/.wh..wh..opq",
            "./etc/openmpi/openmpi-mca-params.conf",
            "./usr/lib/.wh.libold.so",
            "./.wh.toplevel",
            "./usr/bin/hpcc",
            "",
        ]
    )
    assert deleted == ["usr/lib/libold.so", "toplevel"]
    assert emptied == ["etc/openmpi"]


def test_hpcc_input_asks_for_one_problem_on_a_1x2_grid() -> None:
    lines = HPCC_INPUT.splitlines()
    assert lines[5].split()[0] == str(HPL_N)
    assert (lines[10].split()[0], lines[11].split()[0]) == ("1", "2")  # P x Q


def test_make_bench_leaves_it_out(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import pkgutil

    import bench.__main__ as run_all
    import bench.bench_workloads as wl

    ran: list[str] = []
    monkeypatch.setattr(
        pkgutil,
        "iter_modules",
        lambda _: [pkgutil.ModuleInfo(None, "bench_workloads", False)],
    )
    monkeypatch.setattr(run_all, "bench_testbed_if_running", lambda: None)
    monkeypatch.setattr(wl, "main", lambda: ran.append("workloads"))
    run_all.main()
    assert ran == []
    assert "python -m bench.bench_workloads" in capsys.readouterr().out


def test_of_best_takes_each_figure_in_its_better_direction() -> None:
    pods = {"hpl_gflops": [8.0, 10.0], "latency_us": [30.0, 20.0]}
    host = {"hpl_gflops": [5.0, 10.0], "latency_us": [10.0, 50.0]}
    lines = {line.split()[0]: line for line in ratio_lines(pods, host, of_best=True)[1:]}
    assert lines["hpl_gflops"].split()[1:4] == ["10.00", "10.00", "1.00"]
    assert lines["latency_us"].split()[1:4] == ["20.00", "10.00", "2.00"]
    assert lines["latency_us"].endswith("NOT met")
    assert ratio_lines(pods, host, of_best=True)[0].startswith("figure (best)")
