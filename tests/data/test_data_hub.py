"""hf: sources from local files and folders (offline), and the error when the Hub is unreachable."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from convergent.data import DataSourceError, fetch, is_cached, load_splits

from .conftest import WhitespaceTokenizer

datasets = pytest.importorskip("datasets")

WORDS = ["great", "awful", "fine", "dull", "moving", "boring", "superb", "weak"]


def make_rows(count: int) -> list[dict[str, str]]:
    return [
        {
            "text": f"a {WORDS[i % 8]} film number {i}",
            "label": "positive" if i % 2 == 0 else "negative",
        }
        for i in range(count)
    ]


def test_local_csv_file_with_string_labels_and_the_minilm_tokenizer(
    tmp_path: Path, temporary_cache: Path, minilm_tokenizer: object
) -> None:
    path = tmp_path / "reviews.csv"
    rows = make_rows(50)
    path.write_text("text,label\n" + "".join(f"{row['text']},{row['label']}\n" for row in rows))
    assert is_cached(f"hf:{path}") and fetch(f"hf:{path}") == path
    splits = load_splits(f"hf:{path}", seed=0, max_length=16, tokenizer=minilm_tokenizer)
    assert (splits.task, splits.num_outputs, splits.seq_len, splits.vocab_size) == (
        "classification", 2, 16, 30522,
    )  # fmt: skip
    assert [len(part) for part in (splits.train, splits.validation, splits.test)] == [40, 5, 5]
    assert splits.train.tensors["input_ids"].shape == (40, 16)
    assert splits.info["label_names"] == ["negative", "positive"]
    # Labels follow the rows: row i is positive (index 1) when i is even.
    expected = torch.tensor([1 - i % 2 for i in range(50)])
    assert torch.equal(splits.train.tensors["labels"], expected[splits.info["indices"]["train"]])
    other = load_splits(f"hf:{path}", seed=1, max_length=16, tokenizer=minilm_tokenizer)
    assert not torch.equal(splits.info["indices"]["test"], other.info["indices"]["test"])


def test_local_jsonl_with_sentence_column_and_integer_labels(
    tmp_path: Path, temporary_cache: Path, whitespace_tokenizer: WhitespaceTokenizer
) -> None:
    path = tmp_path / "data.jsonl"
    lines = [
        json.dumps({"sentence": row["text"], "label": i % 3}) for i, row in enumerate(make_rows(30))
    ]
    path.write_text("\n".join(lines) + "\n")
    splits = load_splits(f"hf:{path}", tokenizer=whitespace_tokenizer, max_length=8)
    assert splits.num_outputs == 3 and splits.info["text_column"] == "sentence"
    assert sum(len(part) for part in (splits.train, splits.validation, splits.test)) == 30


def test_save_to_disk_folder_keeps_its_own_splits(
    tmp_path: Path, temporary_cache: Path, whitespace_tokenizer: WhitespaceTokenizer
) -> None:
    features = datasets.Features(
        {
            "review": datasets.Value("string"),
            "stars": datasets.ClassLabel(names=["bad", "ok", "good"]),
        }
    )

    def part(count: int, offset: int) -> object:
        return datasets.Dataset.from_dict(
            {
                "review": [f"review {offset + i}" for i in range(count)],
                "stars": [i % 3 for i in range(count)],
            },
            features=features,
        )

    folder = tmp_path / "saved"
    datasets.DatasetDict(
        {"train": part(12, 0), "validation": part(4, 100), "test": part(5, 200)}
    ).save_to_disk(str(folder))
    splits = load_splits(
        f"hf:{folder}",
        tokenizer=whitespace_tokenizer,
        max_length=4,
        text_column="review",
        label_column="stars",
    )
    assert [len(part) for part in (splits.train, splits.validation, splits.test)] == [12, 4, 5]
    assert splits.num_outputs == 3
    assert splits.info["indices"]["test"].tolist() == list(range(16, 21))


def test_missing_column_is_named(tmp_path: Path, temporary_cache: Path) -> None:
    path = tmp_path / "data.csv"
    path.write_text("body,label\nhello,1\nworld,0\n")
    with pytest.raises(ValueError, match=r"No text column found among \['body', 'label'\]"):
        load_splits(f"hf:{path}")


def test_unreachable_hub_dataset_gives_one_clear_error(
    temporary_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def offline(*args: object, **kwargs: object) -> None:
        raise ConnectionError("Couldn't reach the Hugging Face Hub")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(
        DataSourceError, match=r"'hf:some-user/no-such-dataset' cannot be loaded.*local"
    ):
        load_splits("hf:some-user/no-such-dataset")
    assert not is_cached("hf:some-user/no-such-dataset")


def test_unlabelled_test_split_is_replaced_by_a_seeded_split_of_the_labelled_rows(
    tmp_path: Path, temporary_cache: Path, whitespace_tokenizer: WhitespaceTokenizer
) -> None:
    def part(labels: list[int]) -> object:
        return datasets.Dataset.from_dict(
            {"text": [f"text {i}" for i in range(len(labels))], "label": labels}
        )

    folder = tmp_path / "glue_like"
    datasets.DatasetDict(
        {"train": part([0, 1] * 20), "validation": part([1, 0] * 5), "test": part([-1] * 7)}
    ).save_to_disk(str(folder))
    splits = load_splits(f"hf:{folder}", tokenizer=whitespace_tokenizer, max_length=4)
    assert [len(part) for part in (splits.train, splits.validation, splits.test)] == [40, 5, 5]
    assert (splits.test.tensors["labels"] >= 0).all()
    assert torch.cat(list(splits.info["indices"].values())).max() < 50  # no test row used
