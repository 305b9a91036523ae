"""The LoCoMo loader reads every way the data set writes its dia ids (the eval's evidence)."""

from datetime import UTC, datetime

from eval.dataset import Session, dia_ids


def test_dia_ids_are_read_in_every_form_the_data_set_writes() -> None:
    assert dia_ids("D4:17, D4:19") == ("D4:17", "D4:19")
    assert dia_ids("D9:1 D4:4 D4:6") == ("D9:1", "D4:4", "D4:6")
    assert dia_ids(["D:11:26", "D2:3"]) == ("D11:26", "D2:3")
    # conv-50's evidence for turn D30:5
    assert dia_ids(["D30:05"]) == ("D30:5",)
    assert dia_ids(["D1:2", "D1:2; D1:3"]) == ("D1:2", "D1:3")
    assert dia_ids(["D"]) == ()
    assert dia_ids(None) == ()


def test_a_session_is_replayed_at_the_time_it_took_place() -> None:
    """The replay dates each turn by its session's ``date_time`` (D9.31), read as UTC."""
    at = Session(1, "1:56 pm on 8 May, 2023", (), ()).said_at
    assert at is not None and datetime.fromtimestamp(at / 1000, UTC) == datetime(
        2023, 5, 8, 13, 56, tzinfo=UTC
    )
    assert Session(2, "", (), ()).said_at is None
