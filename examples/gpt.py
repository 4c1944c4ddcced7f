"""A small GPT as a LightningModule, with a synthetic next-token task it can learn, for demos and benchmarks.

The layout is the usual one (token and position embeddings, ``n_layer`` identical blocks in a ``ModuleList``, a final
norm, the head, and the loss in ``training_step``), which is what regional compilation is about: the blocks repeat, the
rest does not.

"""

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset

from lightning.pytorch import LightningModule


@dataclass(frozen=True)
class GPTConfig:
    """The model's size. The defaults run in seconds on a CPU; ``GPTConfig.gpt2_small()`` is the 124M model."""

    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 64
    block_size: int = 64
    vocab_size: int = 256
    batch_size: int = 8
    samples: int = 256
    #: ``"gpt2"``: LayerNorm and a GELU MLP; ``"llama"``: RMSNorm written in tensor ops and a SwiGLU MLP, the layout of
    #: most recent models, whose many small element-wise steps are what a compiler fuses (the demo's model on CPU)
    block: str = "gpt2"

    @classmethod
    def gpt2_small(cls, **overrides: Any) -> "GPTConfig":
        """GPT-2 small: 12 layers, 768 wide, 12 heads, a vocabulary of 50257 and sequences of 1024."""
        return cls(**{"n_layer": 12, "n_head": 12, "n_embd": 768, "block_size": 1024, "vocab_size": 50257, **overrides})


class Block(nn.Module):
    """Pre-norm attention and MLP, each with a residual connection."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.n_head = config.n_head
        self.ln_1 = nn.LayerNorm(config.n_embd)
        self.attn = nn.Linear(config.n_embd, 3 * config.n_embd)
        self.proj = nn.Linear(config.n_embd, config.n_embd)
        self.ln_2 = nn.LayerNorm(config.n_embd)
        self.fc = nn.Linear(config.n_embd, 4 * config.n_embd)
        self.fc_out = nn.Linear(4 * config.n_embd, config.n_embd)

    def forward(self, x: Tensor) -> Tensor:
        batch, time, channels = x.shape
        q, k, v = self.attn(self.ln_1(x)).split(channels, dim=2)
        heads = (batch, time, self.n_head, channels // self.n_head)
        q, k, v = (t.view(heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).contiguous().view(batch, time, channels))
        return x + self.fc_out(F.gelu(self.fc(self.ln_2(x))))


class RMSNorm(nn.Module):
    """Root-mean-square normalization, written as most models write it: several element-wise steps."""

    def __init__(self, width: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(width))

    def forward(self, x: Tensor) -> Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class LlamaBlock(Block):
    """Pre-norm attention and a SwiGLU MLP, with RMSNorm: the attention of :class:`Block`, another MLP."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__(config)
        self.ln_1, self.ln_2 = RMSNorm(config.n_embd), RMSNorm(config.n_embd)
        self.fc = nn.Linear(config.n_embd, 2 * 4 * config.n_embd, bias=False)  # the gate and the value

    def forward(self, x: Tensor) -> Tensor:
        batch, time, channels = x.shape
        q, k, v = self.attn(self.ln_1(x)).split(channels, dim=2)
        heads = (batch, time, self.n_head, channels // self.n_head)
        q, k, v = (t.view(heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).contiguous().view(batch, time, channels))
        gate, value = self.fc(self.ln_2(x)).chunk(2, dim=-1)
        return x + self.fc_out(F.silu(gate) * value)


class GPT(nn.Module):
    """Embeddings, ``n_layer`` blocks, the final norm and the head."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = nn.Embedding(config.block_size, config.n_embd)
        block = {"gpt2": Block, "llama": LlamaBlock}[config.block]
        self.blocks = nn.ModuleList(block(config) for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.n_embd)
        self.head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, idx: Tensor) -> Tensor:
        positions = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(positions)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


class NextTokenData(Dataset):
    """Sequences where each token follows from the one before it by a fixed rule, so the loss can fall."""

    def __init__(self, config: GPTConfig, seed: int = 0) -> None:
        generator = torch.Generator().manual_seed(seed)
        start = torch.randint(0, config.vocab_size, (config.samples, 1), generator=generator)
        steps = torch.arange(config.block_size + 1)
        self.tokens = (start * 7 + steps * 13) % config.vocab_size

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor]:
        sequence = self.tokens[index]
        return sequence[:-1], sequence[1:]


class GPTModule(LightningModule):
    """Trains :class:`GPT` on :class:`NextTokenData` and logs the loss in every step, as real models do."""

    def __init__(self, config: GPTConfig = GPTConfig(), lr: float = 3e-3) -> None:
        super().__init__()
        self.config = config
        self.lr = lr
        self.model = GPT(config)

    def forward(self, idx: Tensor) -> Tensor:
        return self.model(idx)

    def _loss(self, batch: tuple[Tensor, Tensor]) -> Tensor:
        x, y = batch
        logits = self(x)
        return F.cross_entropy(logits.view(-1, logits.size(-1)), y.reshape(-1))

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        loss = self._loss(batch)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        loss = self._loss(batch)
        self.log("val_loss", loss)
        return loss

    def predict_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        return self(batch[0]).argmax(-1)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=self.lr, weight_decay=0.0)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(NextTokenData(self.config), batch_size=self.config.batch_size, shuffle=False)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(NextTokenData(self.config, seed=1), batch_size=self.config.batch_size)


class LogOutsideStepGPT(GPTModule):
    """The same, logging its loss after the step: Lightning 2.6.6 cannot compile a step that calls ``self.log``.

    (On torch 2.13, Dynamo fails inside ``LightningModule.log``; the package's ``use_compile`` compiles such a step.)
    """

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        return self._loss(batch)

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.log("train_loss", outputs["loss"], prog_bar=True)


def parameter_count(module: nn.Module) -> int:
    """The number of parameters, for labels."""
    return sum(p.numel() for p in module.parameters())
