"""MFU's peak is that of the CPU set a run uses: physical cores x the 1-core peak, SMT siblings once."""

from worker.loop import _peaks


def test_peak_counts_physical_cores_of_the_set():
    facts = {"core_cpus": [[0, 2], [1, 3]], "gemm_gflops_fp32_1c": 100.0, "gemm_gflops_fp32_all": 180.0}
    assert _peaks(facts, [0, 2])["fp32"] == 100.0  # two SMT siblings: one core's FMA units
    assert _peaks(facts, [0, 1])["fp32"] == 180.0  # two cores: capped by the measured all-core peak
    assert _peaks(facts, [1])["fp32"] == 100.0
    assert "1 physical core" in _peaks(facts, [0, 2])["basis"]


def test_without_a_one_core_figure_the_all_core_peak_is_shared_by_physical_cores():
    facts = {"core_cpus": [[0], [1], [2], [3]], "gemm_gflops_fp32_all": 200.0}
    assert _peaks(facts, [1, 2])["fp32"] == 100.0
    assert _peaks({}, [0]) is None
