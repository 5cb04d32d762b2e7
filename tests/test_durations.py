import pytest

from device_loop.core.durations import format_duration, iso, parse_duration, parse_iso

pytestmark = pytest.mark.timeout(5)


@pytest.mark.parametrize("text, seconds", [("90s", 90), ("30m", 1800), ("2h", 7200), ("1d", 86400), ("45", 45),
                                           (" 1.5h ", 5400), ("1h30m", 5400), ("2d04h", 187200), ("1h05m", 3900)])
def test_parse(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "soon", "5x", "0s", "-3m", "1w"])
def test_refuse(text):
    with pytest.raises(ValueError):
        parse_duration(text)


@pytest.mark.parametrize("seconds", [5, 600, 3900, 93600, 8_640_000])
def test_what_is_printed_can_be_typed_back(seconds):
    assert parse_duration(format_duration(seconds)) == seconds


def test_format_and_iso():
    assert [format_duration(s) for s in (5, 600, 3900, 93600, 7200, 7 * 86400)] == [
        "5s", "10m", "1h05m", "1d02h", "2h", "7d"]
    assert iso(0) == "1970-01-01T00:00:00Z" and parse_iso("1970-01-01T00:01:00Z") == 60
