"""The keys of the ``descent`` study's claims: summaries, reports and history find a claim by
its key, never by its wording."""

from __future__ import annotations

CLEAN_PAPER_KEY = "descent.text_clean_within_paper_margin"
CLEAN_KEY = "descent.text_clean_within_1_point"
TEXT_MONOTONE_KEY = "descent.text_layers_monotone"
VIDEO_NOISE_KEY = "descent.video_lower_rmse_beyond_training_noise"
VIDEO_MONOTONE_KEY = "descent.video_layers_monotone"
LANGUAGE_CLEAN_KEY = "descent.language_clean_win_rate_even"
LANGUAGE_NOISE_KEY = "descent.language_noisy_win_rate_above_half"
LANGUAGE_MONOTONE_KEY = "descent.language_layers_monotone"


def robustness_key(kind: str) -> str:
    """The key of part (a)'s claim under perturbation ``kind`` (a key of ``data.text.levels``)."""
    return f"descent.text_robust_to_{kind}"


# The parts' grid searches, as `results.json`'s ``tuning`` names them.
TEXT_TUNING = "(a) MiniLM on rt-sentences, selection seed"
VIDEO_TUNING = "(b) street-video denoiser, selection seed"
LANGUAGE_TUNING = "(c) Austen language model, selection seed"
