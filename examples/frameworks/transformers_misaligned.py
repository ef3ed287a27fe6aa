"""Hugging Face transformers' Trainer: a callback keeps the best eval loss across
ranks with an all_reduce, but only on the main process (`state.is_world_process_zero`).
Rank 0 waits in the all_reduce after the first evaluation; rank 1 goes back to
training and waits in DDP's gradient all_reduce.

A tiny BERT built from a config with random weights: nothing is downloaded.

    ncclcheck preflight --nproc-per-node 2 examples/frameworks/transformers_misaligned.py
"""

import tempfile

import torch
import torch.distributed as dist
from torch.utils.data import Dataset
from transformers import (
    BertConfig,
    BertForSequenceClassification,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)


class Sentences(Dataset):
    """Random token ids with a label that depends on them: enough to train on."""

    def __init__(self, samples: int, seed: int) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.input_ids = torch.randint(1, 64, (samples, 12), generator=gen)
        self.labels = (self.input_ids[:, 0] > 32).long()

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.input_ids[index], "labels": self.labels[index]}


class BestEvalLoss(TrainerCallback):
    """The lowest eval loss any rank saw, kept on the main process."""

    def __init__(self) -> None:
        self.best = float("inf")

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        if state.is_world_process_zero:  # "only the main process keeps the best"
            loss = torch.tensor([metrics["eval_loss"]])
            dist.all_reduce(loss, op=dist.ReduceOp.MIN)
            self.best = min(self.best, loss.item())


def main() -> None:
    config = BertConfig(
        vocab_size=64,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=16,
        num_labels=2,
    )
    model = BertForSequenceClassification(config)
    args = TrainingArguments(
        output_dir=tempfile.mkdtemp(prefix="hf-trainer-"),
        per_device_train_batch_size=8,
        per_device_eval_batch_size=8,
        num_train_epochs=2,
        eval_strategy="epoch",
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        ddp_backend="gloo",
        disable_tqdm=True,
        logging_strategy="no",
    )
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=Sentences(128, 0),
        eval_dataset=Sentences(32, 1),
        callbacks=[BestEvalLoss()],
    )
    trainer.train()


if __name__ == "__main__":
    main()
