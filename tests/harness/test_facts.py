"""The machine beside the numbers: the CPU named with what tells hosts of one name apart."""

from __future__ import annotations

from speccomplete.harness.lib import facts
from speccomplete.harness.lib.facts import cpu_facts, cpu_line

CPUINFO = """processor	: 0
vendor_id	: AuthenticAMD
cpu family	: 26
model		: 2
model name	: AMD EPYC
flags		: fpu sse avx fma avx2 avx512f avx512bw avx512_vnni avx512_bf16 sha_ni
processor	: 1
model name	: AMD EPYC
"""


def test_cpu_facts_read_the_name_the_family_and_model_and_the_vector_extensions(tmp_path, monkeypatch):
    info = tmp_path / "cpuinfo"
    info.write_text(CPUINFO)
    monkeypatch.setattr(facts, "CPUINFO", info)
    got = cpu_facts()
    assert got == {
        "cpu": "AMD EPYC",
        "cpu_family_model": "26/2",
        "cpu_isa": ["avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16"],
    }
    assert cpu_line(got) == "AMD EPYC (26/2: avx2 fma avx512f avx512_vnni avx512_bf16)"


def test_a_cpu_without_cpuinfo_is_named_as_the_platform_names_it(tmp_path, monkeypatch):
    monkeypatch.setattr(facts, "CPUINFO", tmp_path / "absent")
    monkeypatch.setattr(facts.platform, "processor", lambda: "arm")
    got = cpu_facts()
    assert got == {"cpu": "arm", "cpu_family_model": None, "cpu_isa": []}
    assert cpu_line(got) == "arm"
