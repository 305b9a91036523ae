"""The LoCoMo loader reads every way the data set writes its dia ids (the eval's evidence)."""

from eval.dataset import dia_ids


def test_dia_ids_are_read_in_every_form_the_data_set_writes() -> None:
    assert dia_ids("D4:17, D4:19") == ("D4:17", "D4:19")
    assert dia_ids("D9:1 D4:4 D4:6") == ("D9:1", "D4:4", "D4:6")
    assert dia_ids(["D:11:26", "D2:3"]) == ("D11:26", "D2:3")
    # conv-50's evidence for turn D30:5
    assert dia_ids(["D30:05"]) == ("D30:5",)
    assert dia_ids(["D1:2", "D1:2; D1:3"]) == ("D1:2", "D1:3")
    assert dia_ids(["D"]) == ()
    assert dia_ids(None) == ()
