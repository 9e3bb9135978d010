"""A tiny BERT on synthetic token sequences with Hugging Face's Trainer under torchrun: its own DDP
(hf_plain.py), or with antdt (hf_antdt.py).

    torchrun --nproc-per-node 3 examples/hf_plain.py
    antdt up      # in another terminal, then export what it prints, and:
    torchrun --nproc-per-node 3 examples/hf_antdt.py

``diff examples/hf_plain.py examples/hf_antdt.py`` shows what antdt changes. A group torchrun
restarts (``--max-restarts``) resumes from the last checkpoint.
"""

import argparse
import sys
from pathlib import Path

import torch
from transformers import Trainer, TrainingArguments
from transformers.trainer_utils import get_last_checkpoint

sys.path.insert(0, str(Path(__file__).parent))
from sequences import SyntheticSequences, accuracy, tiny_bert  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=12000)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--output", type=Path, default=Path("hf-output"))
    parser.add_argument("--save-every", type=int, default=100, help="steps")
    args = parser.parse_args()
    torch.manual_seed(0)
    dataset = SyntheticSequences(args.samples)
    model = tiny_bert()
    training = TrainingArguments(
        args.output,
        per_device_train_batch_size=args.batch_size,
        num_train_epochs=args.epochs,
        learning_rate=2e-3,
        save_strategy="steps",
        save_steps=args.save_every,
        logging_strategy="no",
        report_to="none",
        disable_tqdm=True,
        use_cpu=not torch.cuda.is_available(),
    )
    trainer = Trainer(model=model, args=training, train_dataset=dataset)
    last = get_last_checkpoint(args.output) if args.output.is_dir() else None
    trainer.train(resume_from_checkpoint=last)
    if trainer.is_world_process_zero():
        print(f"held-out accuracy {accuracy(model, dataset.heldout()):.3f}", flush=True)


if __name__ == "__main__":
    main()
