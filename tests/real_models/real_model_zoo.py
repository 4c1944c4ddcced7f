"""Model families users train with Lightning, from their own libraries: tiny configs, random init, synthetic data.

Nothing is downloaded: no ``from_pretrained``, no tokenizer, no data set; token ids and pixels come from a seeded
generator. Each family gives the LightningModule the Trainer fits, how to draw a sample, and the
model's forward and loss as a plain function, for the plain ``torch.compile`` reference.
"""

from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset

from lightning.pytorch import LightningModule
from lightning.pytorch.demos import LightningTransformer

BATCH = 4
SEQ = 16
VOCAB = 128
SAMPLES = 64  # more than the steps a test runs: every batch is full, so no shape changes


class SyntheticSamples(Dataset):
    """``SAMPLES`` samples drawn once from a seeded generator by ``draw(generator)``."""

    def __init__(self, draw: Callable[[torch.Generator], Any]) -> None:
        generator = torch.Generator().manual_seed(1234)
        self.samples = [draw(generator) for _ in range(SAMPLES)]

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> Any:
        return self.samples[index]


def _tokens(generator: torch.Generator) -> Tensor:
    return torch.randint(0, VOCAB, (SEQ,), generator=generator)


def causal_lm_sample(generator: torch.Generator) -> dict[str, Tensor]:
    ids = _tokens(generator)
    return {"input_ids": ids, "attention_mask": torch.ones(SEQ, dtype=torch.long), "labels": ids.clone()}


def masked_lm_sample(generator: torch.Generator) -> dict[str, Tensor]:
    ids = _tokens(generator)
    masked = torch.rand(SEQ, generator=generator) < 0.25
    masked[0] = True  # at least one position carries a label
    labels = torch.where(masked, ids, torch.full_like(ids, -100))
    inputs = torch.where(masked, torch.full_like(ids, 3), ids)  # 3 plays [MASK]
    return {"input_ids": inputs, "attention_mask": torch.ones(SEQ, dtype=torch.long), "labels": labels}


def image_sample(generator: torch.Generator) -> dict[str, Tensor]:
    return {
        "pixel_values": torch.randn(3, 16, 16, generator=generator),
        "labels": torch.randint(0, 10, (), generator=generator),
    }


def seq2seq_sample(generator: torch.Generator) -> tuple[Tensor, Tensor]:
    ids = torch.randint(0, VOCAB, (SEQ + 1,), generator=generator)
    return ids[:-1], ids[1:]


class HFModule(LightningModule):
    """How a Lightning user trains a ``transformers`` model: ``self.model(**batch).loss``, logged, AdamW."""

    def __init__(
        self, build: Callable[[], nn.Module], draw: Callable[[torch.Generator], Any], **call_kwargs: Any
    ) -> None:
        super().__init__()
        self.model = build()
        self._draw = draw
        self._call_kwargs = call_kwargs  # more arguments for the model's call, such as `use_cache=False`

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        loss = self.model(**batch, **self._call_kwargs).loss
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-3)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(SyntheticSamples(self._draw), batch_size=BATCH)


class DemoTransformer(LightningTransformer):
    """Lightning's own ``lightning.pytorch.demos.LightningTransformer``, on synthetic tokens instead of WikiText2."""

    def __init__(self) -> None:
        super().__init__(vocab_size=VOCAB)  # the demo's Transformer: 200 wide, 2 encoder + 2 decoder layers

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        loss = super().training_step(batch, batch_idx)
        self.log("train_loss", loss)
        return loss

    def prepare_data(self) -> None:
        pass  # the demo downloads WikiText2 here

    def train_dataloader(self) -> DataLoader:
        return DataLoader(SyntheticSamples(seq2seq_sample), batch_size=BATCH)


def llama(layers: int = 16) -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    return LlamaForCausalLM(config)


def bert() -> nn.Module:
    from transformers import BertConfig, BertForMaskedLM

    config = BertConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=4,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=64,
    )  # dropout 0.1, as BERT trains
    return BertForMaskedLM(config)


def vit() -> nn.Module:
    from transformers import ViTConfig, ViTForImageClassification

    config = ViTConfig(
        image_size=16,
        patch_size=4,
        num_channels=3,
        hidden_size=32,
        num_hidden_layers=4,
        num_attention_heads=4,
        intermediate_size=64,
        num_labels=10,
    )
    return ViTForImageClassification(config)


def _hf_forward_and_loss(module: LightningModule, batch: dict[str, Tensor]) -> Tensor:
    return module.model(**batch).loss


def _demo_forward_and_loss(module: LightningModule, batch: tuple[Tensor, Tensor]) -> Tensor:
    inputs, target = batch
    return F.nll_loss(module(inputs, target), target.view(-1))


@dataclass(frozen=True)
class Family:
    """One model family."""

    make_module: Callable[[], LightningModule]
    #: the model's forward and the loss, as the training step computes them, without Lightning around them
    forward_and_loss: Callable[[LightningModule, Any], Tensor]
    draw: Callable[[torch.Generator], Any]
    needs_transformers: bool = True

    def batch(self) -> Any:
        return next(iter(DataLoader(SyntheticSamples(self.draw), batch_size=BATCH)))


FAMILIES: dict[str, Family] = {
    "llama16": Family(lambda: HFModule(llama, causal_lm_sample), _hf_forward_and_loss, causal_lm_sample),
    "bert": Family(lambda: HFModule(bert, masked_lm_sample), _hf_forward_and_loss, masked_lm_sample),
    "vit": Family(lambda: HFModule(vit, image_sample), _hf_forward_and_loss, image_sample),
    "lightning_transformer": Family(DemoTransformer, _demo_forward_and_loss, seq2seq_sample, needs_transformers=False),
}
