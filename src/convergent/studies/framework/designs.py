"""Which design's results a study's code scores: the current design's, an earlier one's as
exploratory, or none (`OtherDesign`)."""

from __future__ import annotations

from collections.abc import Collection


class OtherDesign(ValueError):
    """Results of a design that a study's current code does not score.

    Attributes:
        found: the payload's design (1 when it carries no number).
        current: the design the study's code scores.
    """

    def __init__(self, message: str, found: int, current: int) -> None:
        super().__init__(message)
        self.found = found
        self.current = current


def check_design(
    study: str, found: int | None, current: int, rescorable: Collection[int] = ()
) -> bool:
    """Refuse results of a design the study's code cannot score; say whether the scoring is
    exploratory.

    Args:
        study: the study's name.
        found: the payload's design (None when it carries no number: the first design's).
        current: the design the study's scorer implements.
        rescorable: earlier designs whose stored data the current claims can be scored on;
            such a scoring is exploratory (its forms were chosen after that data was seen).

    Returns:
        True when ``found`` is one of ``rescorable`` (the claims are exploratory), False when it
        is ``current``.

    Raises:
        OtherDesign: a ValueError, one sentence naming both designs and where the earlier
            ones are kept.
    """
    if found in rescorable and found != current:
        return True
    if found != current:
        stated = "1 (no design number)" if found is None else found
        also = "".join(f" and, exploratory, design {d}'s data" for d in sorted(rescorable))
        raise OtherDesign(
            f"these {study} results are of design {stated}, and this code scores design "
            f"{current}{also} only; earlier designs' full results, with the claims they were scored "
            f"with, are in docs/results/{study}-full/history/",
            1 if found is None else found,
            current,
        )
    return False
