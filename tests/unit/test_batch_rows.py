"""What one ``chattts-serve batch`` input row may set (``deployments/bulk/config.BatchRow``, checked
by ``rows.check_row`` on the driver): the request options, not what a service fills in itself.
No Ray."""

from __future__ import annotations

import pytest

from deployments.bulk.rows import check_row

ROW = {"id": "r1", "text": "你好。"}


def test_a_plain_row_passes():
    row, reason, ignored = check_row(dict(ROW), "wav")
    assert reason is None and ignored == [] and row.request().pronunciations is None


@pytest.mark.parametrize(
    "extra, words",
    [
        # Past the service's bounds (5,000 entries of 128-character aliases) and read nowhere.
        ({"pronunciations": {"entries": [{"text": "的", "alias": "x" * 128}] * 5000}}, "not a field a row may set"),
        ({"pronunciations": "{}"}, "not a field a row may set"),  # a CSV cell
        ({"lexicon": "lex_" + "a" * 24}, "bulk synthesis does not apply lexicons"),
    ],
    ids=["pronunciations", "pronunciations-cell", "lexicon"],
)
def test_a_row_may_not_set_what_bulk_does_not_apply(extra, words):
    """A row's ``pronunciations`` went past every bound (the row model inherits the options), and a
    row's ``lexicon`` was ignored without a word: each is refused with its reason."""
    row, reason, _ = check_row({**ROW, **extra}, "wav")
    field = next(iter(extra))
    assert row is None and reason.startswith(f"invalid_value: {field}: ") and words in reason, reason
    assert check_row({**ROW, "lexicon": "none"}, "wav")[1] is None  # none: as bulk speaks every row
