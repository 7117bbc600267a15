"""COVID-19 Rural subgroups: sex and age from covid_rural_patient_info.csv joined on the stem's patient id; view unknown."""

import pytest
from test_covid_rural import STEMS, opacity_mask, ready, write_covid

from xbench_pl import create_datamodule
from xbench_pl.data.errors import DataError

#: the real file's header (first columns) and layout; STEMS[1]'s patient is absent
INFO = """PATIENT_ID,AGE,SEX,RACE,ZIP,MORTALITY
COVID-19-AR-16406513,44,M,WHITE,722,0
COVID-19-AR-16406515,81,F,WHITE,720,1
COVID-19-AR-16406599,30,F,WHITE,720,0
"""


def test_sex_and_age_joined_on_the_patient_id(tmp_path):
    root = write_covid(tmp_path, {s: opacity_mask() for s in STEMS}, {})
    (root / "covid_rural_patient_info.csv").write_text(INFO)
    dm = ready(create_datamodule("covid_rural", root=str(root)))
    got = {r.image_id: (r.groups.get("sex", "unknown"), r.groups.get("age", "unknown"), r.groups.get("view", "unknown"))
           for r in dm.test_set.records}
    assert got == {STEMS[0]: ("M", "40-59", "unknown"), STEMS[1]: ("unknown", "unknown", "unknown"),
                   STEMS[2]: ("F", "80+", "unknown")}


def test_without_the_file_every_group_is_unknown_and_a_bad_header_is_named(tmp_path):
    root = write_covid(tmp_path / "a", {STEMS[0]: opacity_mask()}, {})
    dm = ready(create_datamodule("covid_rural", root=str(root)))
    assert [r.groups.get("sex", "unknown") for r in dm.test_set.records] == ["unknown"]
    root = write_covid(tmp_path / "b", {STEMS[0]: opacity_mask()}, {})
    (root / "covid_rural_patient_info.csv").write_text("PATIENT_ID,SEX\nCOVID-19-AR-16406513,M\n")
    with pytest.raises(DataError, match=r"covid_rural_patient_info.csv.*missing column\(s\) AGE"):
        ready(create_datamodule("covid_rural", root=str(root)))


def test_the_patient_is_the_unit_and_a_short_row_is_unknown(tmp_path):
    root = write_covid(tmp_path, {s: opacity_mask() for s in STEMS}, {})
    (root / "covid_rural_patient_info.csv").write_text(INFO + "COVID-19-AR-16406514\n")  # a short row: its cells are None
    dm = ready(create_datamodule("covid_rural", root=str(root)))
    assert [r.patient_id for r in dm.test_set.records] == [s.split("_")[0] for s in STEMS]
    assert [r.groups.get("sex", "unknown") for r in dm.test_set.records] == ["M", "unknown", "F"]
