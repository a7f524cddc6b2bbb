"""bakery.clock.utc_stamp: literal expected text, and the ISO form read back by datetime."""

from datetime import UTC, datetime, timedelta, timezone

import pytest

from bakery.clock import FOLDER, ISO, MINUTE, utc_stamp

# 07:46:54 at +05:30 is 02:16:54 UTC
INDIA = datetime(2026, 12, 1, 7, 46, 54, 999_999, tzinfo=timezone(timedelta(hours=5, minutes=30)))


def test_each_style_is_exactly_this_text_in_utc():
    assert utc_stamp(FOLDER, INDIA) == "20261201T021654Z"
    assert utc_stamp(ISO, INDIA) == "2026-12-01T02:16:54+00:00"
    assert utc_stamp(MINUTE, INDIA) == "2026-12-01 02:16 UTC"
    assert utc_stamp(now=INDIA) == "20261201T021654Z"  # folders are the default


def test_iso_matches_what_datetime_itself_writes_and_reads():
    utc = INDIA.astimezone(UTC)
    assert utc_stamp(ISO, INDIA) == utc.isoformat(timespec="seconds")
    assert datetime.fromisoformat(utc_stamp(ISO, INDIA)) == utc.replace(microsecond=0)


def test_now_is_the_current_utc_instant():
    before = datetime.now(UTC).replace(microsecond=0)
    stamp = datetime.fromisoformat(utc_stamp(ISO))
    assert before <= stamp <= datetime.now(UTC)
    assert stamp.utcoffset() == timedelta(0)


def test_a_naive_datetime_is_refused_not_guessed():
    with pytest.raises(ValueError, match="naive datetime"):
        utc_stamp(FOLDER, datetime(2026, 12, 1, 2, 16, 54))
