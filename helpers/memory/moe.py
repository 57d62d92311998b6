"""Mixture-of-experts shapes for the estimator: routed experts split over ``ep`` ranks.

A :class:`MoETransformerShape` is a Llama-shaped decoder whose blocks, after the first
``dense_blocks``, replace the gated MLP by ``experts`` SwiGLU experts of width
``moe_ffn``, a router that sends each token to ``top_k`` of them, and ``shared`` experts
that every token goes through (DeepSeekMoE). Its attention is grouped-query, or
multi-head latent attention (:class:`LatentAttention`, DeepSeek-V2/V3).

Expert parallelism borrows its ranks from data parallelism, as torchtitan's dp2ep and
DeepSeek-V3 do: ``ep`` divides both ``dp`` and ``experts``. Assumptions of the estimate:

- weights: every rank holds the replicated part (embedding, attention, norms, routers,
  shared experts, dense MLPs, head; split by ``tp`` like a dense model's) and ``experts /
  ep`` routed experts of each MoE block, split by ``tp`` too (Megatron-LM's default expert
  tensor parallelism); a router's selection bias is a buffer of 4 bytes or more;
- ZeRO shards the replicated part over the ``dp`` ranks and the experts over the ``dp /
  ep`` ranks that hold the same experts; from stage 2 a rank also holds one unit whole (a
  block with its experts), as :func:`~helpers.memory.parameters.sharded_parameter_memory`;
- the router is balanced and drops nothing: each rank sends its ``T`` tokens' ``top_k``
  copies and receives as many rows, ``T top_k``, whatever ``ep``. An MoE layer keeps what
  :mod:`helpers.expert_parallel.memory` counts for lesson 11's layer: the router's scores,
  choices and gates (at 4 bytes or more, as autocast keeps a softmax in float32; DeepSeek-V3's
  sigmoid scores count the same), the dispatch indices, each expert's rows and four
  ``moe_ffn``-wide tensors, the rows sent home, the shared experts' four tensors; its input
  is the block's. Under ``tp`` the router and dispatch state stay whole on every rank;
- latent attention is counted by the dense block's rules, not measured: fused attention's
  q, k, v, output and log-sum-exp by head, and each latent norm's input, normalised value
  and output, whole on every tensor-parallel rank;
- no multi-token-prediction module, no FP8: DeepSeek-V3's run caches some activations in
  FP8 and recomputes some operations (arXiv:2412.19437, Sections 3.2.3 and 3.3).
"""
from __future__ import annotations

from dataclasses import dataclass

from helpers.memory.ledger import DeviceMemory
from helpers.memory.parameters import ELEMENT_BYTES, sharded_parameter_memory
from helpers.memory.transformer import TransformerShape, _stat_size

INDEX_BYTES = 8  # int64 routing indices


def _count(name: str, value: object, least: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"{name}={value!r}; valid: an integer >= {least}")
    return value


@dataclass(frozen=True)
class LatentAttention:
    """Multi-head latent attention (DeepSeek-V2, arXiv:2405.04434): queries and keys/values
    are projected down to latents of ``q_lora`` and ``kv_lora`` (0: queries projected
    straight), normed, and up to the heads; a rotary key of ``qk_rope`` is shared by them."""

    q_lora: int
    kv_lora: int
    qk_nope: int
    qk_rope: int
    v_head: int

    def __post_init__(self) -> None:
        _count("q_lora", self.q_lora, 0)
        for name in ("kv_lora", "qk_nope", "qk_rope", "v_head"):
            _count(name, getattr(self, name))

    def parameters(self, hidden: int, heads: int) -> tuple[int, int]:
        """(elements, tensors): the down and up projections, the two latent norms, o."""
        qk = self.qk_nope + self.qk_rope
        q = (hidden * self.q_lora + self.q_lora + self.q_lora * heads * qk if self.q_lora
             else hidden * heads * qk)
        kv = hidden * (self.kv_lora + self.qk_rope) + self.kv_lora
        kv += self.kv_lora * heads * (self.qk_nope + self.v_head)
        return q + kv + heads * self.v_head * hidden, 4 + 3 * bool(self.q_lora)

    def split(self, heads: int) -> int:
        """Per token, what fused attention keeps, split by heads: q, k, v, the output."""
        return 2 * heads * (self.qk_nope + self.qk_rope) + 2 * heads * self.v_head

    def latents(self) -> tuple[int, int]:
        """Per token (elements, norm rows) each latent norm keeps, whole on every
        tensor-parallel rank: its input (the key latent's is a slice of a tensor that holds
        the rotary key too), its normalised value and output."""
        kv = self.kv_lora + self.qk_rope + 2 * self.kv_lora
        return 3 * self.q_lora + kv, 1 + bool(self.q_lora)


@dataclass(frozen=True, kw_only=True)
class MoETransformerShape(TransformerShape):
    """A decoder whose blocks from ``dense_blocks`` on are mixtures of experts (``ffn``:
    the dense blocks' MLP width; ``shared_ffn``: each shared expert's, default
    ``moe_ffn``; ``attention``: None for grouped-query attention)."""

    experts: int
    top_k: int
    moe_ffn: int
    shared: int = 0
    shared_ffn: int | None = None
    dense_blocks: int = 0
    attention: LatentAttention | None = None
    router_bias: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("experts", "moe_ffn"):
            _count(name, getattr(self, name))
        _count("shared", self.shared, 0)
        _count("shared_ffn", self.shared_width)
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) \
                or not 1 <= self.top_k <= self.experts:
            raise ValueError(f"top_k={self.top_k!r}; valid: an integer from 1 to "
                             f"experts={self.experts}")
        if isinstance(self.dense_blocks, bool) or not isinstance(self.dense_blocks, int) \
                or not 0 <= self.dense_blocks < self.blocks:
            raise ValueError(f"dense_blocks={self.dense_blocks!r}; valid: an integer from 0 "
                             f"to {self.blocks - 1} (at least one block of experts)")

    @classmethod
    def from_moe(cls, config: object, moe: object) -> MoETransformerShape:
        """From the small Llama's ``LMConfig`` and the ``MoEShape`` of every block's MoE
        layer (its optional shared expert as wide as the routed ones)."""
        return cls(hidden=config.hidden, blocks=config.blocks, heads=config.heads,
                   ffn=config.ffn, vocab=config.vocab, kv_heads=config.kv_heads,
                   tied=getattr(config, "tied", False), experts=moe.experts, top_k=moe.top_k,
                   moe_ffn=moe.ffn, shared=int(moe.shared), router_bias=True)

    @property
    def shared_width(self) -> int:
        """The shared experts' width."""
        return self.moe_ffn if self.shared_ffn is None else self.shared_ffn

    @property
    def moe_blocks(self) -> int:
        """Blocks with experts."""
        return self.blocks - self.dense_blocks

    def attention_parameters(self) -> tuple[int, int]:
        """(elements, tensors) of one block's attention."""
        if self.attention is None:
            return super().attention_parameters()
        return self.attention.parameters(self.hidden, self.heads)

    def expert_parameters(self) -> int:
        """Elements of one routed expert: gate, up, down."""
        return 3 * self.hidden * self.moe_ffn

    def moe_block_parameters(self) -> tuple[int, int]:
        """(elements, tensors) of an MoE block's replicated part: the attention, two
        norms, the router and the shared experts (the routed experts not included)."""
        attn, tensors = self.attention_parameters()
        shared = 3 * self.hidden * self.shared_width * self.shared
        return attn + 2 * self.hidden + self.hidden * self.experts + shared, \
            tensors + 3 + 3 * self.shared

    def _all(self, routed: int) -> int:
        rest = self.embed_parameters()[0] + self.head_parameters()[0]
        moe = self.moe_block_parameters()[0] + routed * self.expert_parameters()
        return rest + self.dense_blocks * self.block_parameters()[0] + self.moe_blocks * moe

    def parameters(self) -> int:
        """All weights (the routers' biases are buffers, not counted)."""
        return self._all(self.experts)

    def active_parameters(self) -> int:
        """The weights one token's forward uses: ``top_k`` routed experts per MoE block,
        everything else (the embedding and the head included)."""
        return self._all(self.top_k)

    def is_moe(self, block: int) -> bool:
        """Whether block number ``block`` (from 0) holds experts."""
        return block >= self.dense_blocks

    def _moe_in(self, start: int, blocks: int) -> int:
        """MoE blocks among the ``blocks`` blocks from ``start``."""
        return max(0, start + blocks - max(start, self.dense_blocks))

    def stage_memory(self, start: int, blocks: int, first: bool, last: bool, *,
                     optimizer: str, precision: str, tp: int = 1, dp: int = 1, ep: int = 1,
                     zero: int = 0) -> DeviceMemory:
        """Weights, gradients and optimizer state on one rank of the pipeline stage of
        ``blocks`` blocks from block ``start`` (see the module's assumptions)."""
        local, (expert, block, moe_block) = self.experts // ep, (
            self.expert_parameters(), self.block_parameters(), self.moe_block_parameters())
        moe = self._moe_in(start, blocks)
        embed, head = self.embed_parameters(), self.head_parameters()
        counts = [(block[0], 0, blocks - moe), (moe_block[0], local * expert, moe),
                  (embed[0], 0, first), (head[0], 0, last)]  # (replicated, experts, how many)
        units = [(d, x) for d, x, n in counts if n]
        dense = sum(d * n for d, _, n in counts)
        tensors = (blocks - moe) * block[1] + moe * moe_block[1] + first * embed[1] \
            + last * head[1]
        kinds = {"optimizer": optimizer, "precision": precision, "zero": zero}
        rep = sharded_parameter_memory(dense // tp, tensors, dp=dp, **kinds)
        exp = sharded_parameter_memory(moe * local * expert // tp, 3 * moe * local,
                                       dp=dp // ep, **kinds)
        e = ELEMENT_BYTES[precision]
        whole = max(d // tp * (dp > 1) + x // tp * (dp // ep > 1) for d, x in units) * e
        bias = moe * self.experts * self.router_bias * _stat_size(e)
        return DeviceMemory(weights=rep.weights + exp.weights + whole * (zero == 3) + bias,
                            grads=rep.grads + exp.grads + whole * (zero >= 2),
                            optimizer_state=rep.optimizer_state + exp.optimizer_state)

    def _block_bytes(self, tokens: int, element_size: int, tp: int, seq_parallel: bool,
                     mlp: int) -> int:
        """:meth:`TransformerShape.block_activation_bytes`'s count, with this shape's
        attention (latent attention: its q, k, v, output, and the latents' norms) and a
        gated MLP ``mlp`` wide (0: none)."""
        h, e, stat = self.hidden, element_size, _stat_size(element_size)
        attn = (2 * h + 2 * self.kv_width if self.attention is None
                else self.attention.split(self.heads))  # q, attention output, k, v
        latent, norms = self.attention.latents() if self.attention else (0, 0)
        replicated = 4 * h // tp + 2 * h if seq_parallel else 6 * h
        per_token = ((attn + 4 * mlp) // tp + replicated + latent) * e + self.heads * stat // tp
        norm_stats = tokens * 2 * stat // (tp if seq_parallel else 1) + tokens * norms * stat
        return tokens * per_token + norm_stats

    def block_activation_bytes(self, tokens: int, element_size: int, tp: int = 1,
                               seq_parallel: bool = False) -> int:
        """Bytes a dense block (one of the first ``dense_blocks``) keeps for backward."""
        return self._block_bytes(tokens, element_size, tp, seq_parallel, self.ffn)

    def moe_layer_bytes(self, tokens: int, element_size: int, tp: int = 1) -> int:
        """Bytes one MoE layer keeps for backward on a rank of ``tokens`` tokens, its input
        (counted by the block) excluded; balanced, nothing dropped."""
        t, k, e, h, n = tokens, self.top_k, element_size, self.hidden, self.experts
        s = _stat_size(e)
        router = t * n * s + (t * k + t) * s + t * k * INDEX_BYTES
        moved = 2 * t * k * INDEX_BYTES + t * k * h * e + t * k * s + n * s
        rows = t * k  # arrive on this rank
        experts = rows * (h + 4 * self.moe_ffn // tp) * e + rows * INDEX_BYTES
        placed = rows * (h * e + INDEX_BYTES)
        shared = t * (4 * self.shared * self.shared_width // tp) * e
        return router + moved + experts + placed + shared

    def moe_block_activation_bytes(self, tokens: int, element_size: int, tp: int = 1,
                                   seq_parallel: bool = False) -> int:
        """Bytes an MoE block keeps for backward: the attention and norms as a dense
        block's, then its MoE layer's."""
        return (self._block_bytes(tokens, element_size, tp, seq_parallel, 0)
                + self.moe_layer_bytes(tokens, element_size, tp))

    def moe_stage_activation_bytes(self, start: int, blocks: int, first: bool, last: bool, *,
                                   tokens: int, element_size: int, tp: int = 1,
                                   recompute: bool = False,
                                   seq_parallel: bool = False) -> tuple[int, int]:
        """:meth:`stage_activation_bytes` for the stage of ``blocks`` blocks from ``start``;
        under recomputation the extra is the largest of its blocks recomputed."""
        e, sp, moe = element_size, seq_parallel, self._moe_in(start, blocks)
        sizes = [(self.moe_block_activation_bytes(tokens, e, tp, sp), moe),
                 (self.block_activation_bytes(tokens, e, tp, sp), blocks - moe)]
        embed = self.embed_activation_bytes(tokens, tp) if first else 0
        head = self.head_activation_bytes(tokens, e, tp, sp) if last else 0
        if not recompute:
            return embed + sum(size * n for size, n in sizes) + head, 0
        kept = self.block_input_bytes(tokens, e, tp, sp)
        largest = max(size for size, n in sizes if n)
        return embed + blocks * kept + head, max(0, largest - kept - head)


def validate_ep(ep: object, dp: int, shape: TransformerShape) -> int:
    """``ep`` if the shape's experts split over that many of the ``dp`` ranks, else a
    ValueError naming the valid choices."""
    if isinstance(ep, bool) or not isinstance(ep, int) or ep < 1:
        raise ValueError(f"ep={ep!r}; valid: an integer >= 1 (expert-parallel ranks)")
    if not isinstance(shape, MoETransformerShape):
        if ep != 1:
            raise ValueError(f"ep={ep} splits experts, and this shape has none; valid: ep=1, "
                             "or a MoETransformerShape")
        return ep
    valid = [d for d in range(1, shape.experts + 1) if shape.experts % d == 0 and dp % d == 0]
    if ep not in valid:
        raise ValueError(f"ep={ep} for {shape.experts} experts and dp={dp}; valid: a divisor "
                         f"of both (expert-parallel ranks are borrowed from the data-parallel "
                         f"ones): {valid}")
    return ep


# DeepSeek-V3 (arXiv:2412.19437, Section 4.2; the sizes read from the released config,
# deepseek-ai/DeepSeek-V3@4c2fdb8 inference/configs/config_671B.json): 61 blocks, the
# first 3 dense (MLP 18432), then 256 routed experts of 2048 and 1 shared, top-8, MLA.
DEEPSEEK_V3_SHAPE = MoETransformerShape(
    hidden=7168, blocks=61, heads=128, ffn=18432, vocab=129280, experts=256, top_k=8,
    moe_ffn=2048, shared=1, dense_blocks=3, router_bias=True,
    attention=LatentAttention(q_lora=1536, kv_lora=512, qk_nope=128, qk_rope=64, v_head=128))
# Mixtral 8x7B (arXiv:2401.04088, Table 1): 32 blocks, 8 experts of 14336, top-2, GQA 32/8.
MIXTRAL_8X7B_SHAPE = MoETransformerShape(
    hidden=4096, blocks=32, heads=32, ffn=14336, vocab=32000, kv_heads=8, experts=8,
    top_k=2, moe_ffn=14336)

_DSV3 = "https://github.com/deepseek-ai/DeepSeek-V3/blob/4c2fdb8f55e049553b9f4f1a3241f86d739c8cf8/"
# (total, active per token, where the numbers are published)
PUBLISHED_PARAMETERS = {
    "DeepSeek-V3": (671e9, 37e9, "arXiv:2412.19437 (abstract, Section 4.2): 671B total, 37B "
                    "activated; " + _DSV3 + "README_WEIGHTS.md: 36.7B activated, the "
                    "multi-token-prediction module's 11.5B (beyond the 671B) left out"),
    "Mixtral 8x7B": (46.7e9, 12.9e9, "Mistral AI, 'Mixtral of experts' (11 Dec 2023, "
                     "https://mistral.ai/news/mixtral-of-experts/): 46.7B total, 12.9B per "
                     "token; the paper (arXiv:2401.04088, abstract) rounds them to 47B, 13B"),
}
