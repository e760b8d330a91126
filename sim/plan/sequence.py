"""The Plan's documents in a row: their lengths, packing, flash attention's work and the step's model tokens and FLOPs.

In: ``training.sequence`` (document lengths, packing), the batch, the model and the fine-tuning method
(``ShardingFacts`` and below). Out: ``SequenceFacts``: the moments of the documents' lengths, greedy packing's padded
tails, documents per row, the share of a row's flash-attention work its documents need, and MFU's numerator: the
document tokens and model FLOPs of one step (Megatron's full-matrix count and the causal one).
"""

from __future__ import annotations

from sim.model.flops import model_flops_per_step
from sim.model.peft import model_flops_per_step as peft_model_flops
from sim.plan.cached import cached_property
from sim.plan.sharding import ShardingFacts
from sim.spec.sequence import LengthStats, PackStats, length_stats, pack_stats


class SequenceFacts(ShardingFacts):
    """Documents in a row, model tokens and FLOPs (a base of ``sim.plan.Plan``)."""

    @cached_property
    def lengths(self) -> LengthStats | None:
        """Moments of the documents' lengths (``training.sequence``, sim.spec.sequence); None in the default case
        (one seq_len document per row), where nothing below changes."""
        seq = self.scenario.training.sequence
        return None if seq.default else length_stats(seq, self.seq_len)

    @cached_property
    def packing_tail(self) -> PackStats | None:
        """Greedy packing's padded row tails (``training.sequence.split_across_pack: false``, torchtune's
        PackedDataset; sim.spec.sequence.pack_stats); None where rows are full or documents padded one per row."""
        seq = self.scenario.training.sequence
        if self.lengths is None or not seq.packing or seq.split_across_pack:
            return None
        return pack_stats(seq, self.seq_len)

    @cached_property
    def documents_per_row(self) -> float:
        """Documents in one seq_len row: seq_len / E[s] packed (split across rows), the renewal average of greedy
        packing without splitting (``packing_tail``), one padded."""
        packed = self.lengths is not None and self.scenario.training.sequence.packing
        if self.packing_tail is not None:
            return self.packing_tail.documents_per_row
        return self.seq_len / self.lengths.mean if packed and self.lengths is not None else 1.0

    @cached_property
    def attention_work(self) -> tuple[float, float] | None:
        """(share of a row's full-matrix flash-attention FLOPs its documents need, the share of those a causal
        kernel executes). A row's documents, each attended alone by flash attention's varlen kernel, need
        n E[s^2] / seq_len^2 of the row's seq_len^2 (packed: n = seq_len / E[s]; padded: n = 1, transformers
        unpadding FlashAttention-2's input); each executes its own causal share. None (the row's full matrix and
        its causal share, as sim.model.attention_ops prices it) without flash attention or in the default case."""
        if self.lengths is None or not self.scenario.training.flash_attention:
            return None
        documents = self.documents_per_row * self.lengths.mean_square
        tail = self.packing_tail
        if tail is None:
            return documents / self.seq_len**2, self.lengths.causal_share
        # torchtune appends the padding to the row's seq_lens: the varlen kernel attends it as one more sequence
        work = documents + tail.pad_mean_square
        return work / self.seq_len**2, (documents * self.lengths.causal_share + tail.pad_causal_work) / work

    @cached_property
    def model_tokens_per_step(self) -> float:
        """Document tokens one step trains on (tokens/s counts these): global_batch x seq_len, less the padding
        (global_batch x E[s] when documents are padded, global_batch x documents per row x E[s] when greedy
        packing pads each row's tail)."""
        rows = self.global_batch * self.seq_len
        if self.lengths is None or (self.scenario.training.sequence.packing and self.packing_tail is None):
            return float(rows)
        return self.global_batch * self.documents_per_row * self.lengths.mean

    @cached_property
    def model_flops_per_step(self) -> float:
        """MFU's numerator: the model FLOPs of the step's documents (sim.model.flops.model_flops_per_step,
        or sim.model.peft's under a fine-tuning method). A sequence's FLOPs are a s + c s^2 (linear layers and
        logits per token, attention per token pair, Korthikanti et al. eq. 7's form), so the documents' FLOPs are
        rows x documents per row x (a E[s] + c E[s^2]): padding tokens and the attention between packed
        documents are not model FLOPs."""
        if self.lengths is None:
            return self._sequence_flops(self.global_batch, self.seq_len)
        linear, quadratic = self._flops_terms
        per_document = linear * self.lengths.mean + quadratic * self.lengths.mean_square
        return self.global_batch * self.documents_per_row * per_document

    @cached_property
    def causal_model_flops_per_step(self) -> float | None:
        """``model_flops_per_step`` under the causal convention: each sequence's attention counted over the
        s (s + 1) / 2 query-key pairs a causal mask keeps (half the s x s matrix plus its diagonal, what a causal
        flash kernel needs) instead of Megatron's full s^2 (megatron/training/training.py
        num_floating_point_operations, the convention of ``mfu``); None without causal attention. The summary
        reports MFU both ways (``mfu_causal``); at long context they differ most."""
        if not self.scenario.training.causal_attention:
            return None
        linear, quadratic = self._flops_terms
        if self.lengths is None:
            s = self.seq_len
            return self.global_batch * (linear * s + quadratic * s * (s + 1) / 2)
        per_document = linear * self.lengths.mean + quadratic * (self.lengths.mean_square + self.lengths.mean) / 2
        return self.global_batch * self.documents_per_row * per_document

    def _sequence_flops(self, rows: int, seq_len: int) -> float:
        """Model FLOPs of ``rows`` sequences of ``seq_len`` tokens (Megatron's count; PEFT's under a method)."""
        if self.peft.active:  # frozen weights have no weight-gradient GEMM (sim.model.peft)
            return peft_model_flops(self.model, self.peft, rows, seq_len)
        return model_flops_per_step(self.model, rows, seq_len)

    @cached_property
    def _flops_terms(self) -> tuple[float, float]:
        """(a, c) of one sequence's model FLOPs a s + c s^2, from the counts at s = 1 and s = 2."""
        one, two = self._sequence_flops(1, 1), self._sequence_flops(1, 2)
        quadratic = (two - 2 * one) / 2
        return one - quadratic, quadratic
