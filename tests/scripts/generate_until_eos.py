"""Greedy decoding in evaluation with ZeRO-3-style sharded weights: every forward
all-gathers the weight, and each rank stops when its own sequences reach the
end-of-sequence token (huggingface/transformers#20130: generate() without
synced_gpus). The rank that finishes first goes on to the final all_reduce while
the other still gathers weights for its next token.

MODE=unsynced (the default) stops per rank; MODE=synced agrees on the stop first,
as synced_gpus=True does: every rank steps until all are done.
"""

import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

VOCAB, EOS = 16, 0


class ShardedLinear(nn.Module):
    """Each rank holds rows of the weight; forward gathers the whole of it."""

    def __init__(self, features: int, out: int, world: int) -> None:
        super().__init__()
        self.shard = nn.Parameter(torch.randn(out // world, features))
        self.world = world

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        full = torch.empty(self.shard.shape[0] * self.world, self.shard.shape[1])
        dist.all_gather_into_tensor(full, self.shard.detach())
        return F.linear(x, full)


class TinyLM(nn.Module):
    def __init__(self, world: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 8)
        self.head = ShardedLinear(8, VOCAB, world)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(tokens).mean(dim=1))


def generate(model: TinyLM, prompt: torch.Tensor, max_new_tokens: int, synced: bool) -> torch.Tensor:
    tokens = prompt
    for _ in range(max_new_tokens):
        next_token = model(tokens).argmax(dim=-1, keepdim=True)
        tokens = torch.cat([tokens, next_token], dim=1)
        if synced:
            still_decoding = torch.tensor([float(not (next_token == EOS).all())])
            dist.all_reduce(still_decoding)  # stop only when no rank is still decoding
            if still_decoding.item() == 0:
                break
        elif (next_token == EOS).all():  # BUG: this rank's sequences are done, the others' not
            break  # out of the loop on this rank alone
    return tokens


def main() -> None:
    synced = os.environ.get("MODE", "unsynced") == "synced"
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = TinyLM(world)
    with torch.no_grad():  # data that differs per rank: rank 1's prompts reach EOS sooner
        model.embed.weight[EOS + 1 + rank] += 3.0
    prompts = torch.randint(1, VOCAB, (4, 3), generator=torch.Generator().manual_seed(rank))
    model.eval()
    with torch.no_grad():
        lengths = [generate(model, prompt, 12, synced).shape[1] for prompt in prompts.split(2)]
        total = torch.tensor([float(sum(lengths))])
        dist.all_reduce(total)
    print(f"rank {rank}: lengths {lengths}, total {total.item()}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
