"""Input checks shared by the estimators. Every failure is a ``ValueError`` naming the argument."""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import torch


def check_vector(name: str, x: object) -> torch.Tensor:
    """``x`` must be a finite floating ``[B]`` tensor."""
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor of shape [B], got {type(x).__name__}")
    if x.dim() != 1:
        raise ValueError(f"{name} must have shape [B], got {tuple(x.shape)}")
    if not x.is_floating_point():
        raise ValueError(f"{name} must be a floating-point tensor, got dtype {x.dtype}")
    if not bool(torch.isfinite(x).all()):
        raise ValueError(f"{name} contains NaN or inf")
    return x


def check_tokens(name: str, x: object, shape: tuple[int, ...] | None = None,
                 *, finite: bool = True) -> torch.Tensor:
    """``x`` must be a floating ``[B, T]`` tensor (of ``shape`` when given), finite unless told."""
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor of shape [B, T], got {type(x).__name__}")
    if x.dim() != 2:
        raise ValueError(f"{name} must have shape [B, T], got {tuple(x.shape)}")
    if shape is not None and tuple(x.shape) != tuple(shape):
        raise ValueError(
            f"{name} has shape {tuple(x.shape)}, expected {tuple(shape)} (mask's shape)"
        )
    if not x.is_floating_point():
        raise ValueError(f"{name} must be a floating-point tensor, got dtype {x.dtype}")
    if finite and not bool(torch.isfinite(x).all()):
        raise ValueError(f"{name} contains NaN or inf")
    return x


def check_mask(mask: object, *, values: bool = True) -> torch.Tensor:
    """``mask`` must be a ``[B, T]`` tensor of 0/1 values (bool, integer or floating)."""
    if not isinstance(mask, torch.Tensor):
        raise ValueError(f"mask must be a torch.Tensor of shape [B, T], got {type(mask).__name__}")
    if mask.dim() != 2:
        raise ValueError(f"mask must have shape [B, T], got {tuple(mask.shape)}")
    if mask.is_complex():
        raise ValueError(f"mask must be bool, integer or floating, got dtype {mask.dtype}")
    if values and mask.dtype != torch.bool and not bool(((mask == 0) | (mask == 1)).all()):
        raise ValueError(
            "mask must contain only 0 and 1 (policy token = 1, padding/observation = 0)"
        )
    return mask


def check_batch_size(name: str, x: torch.Tensor, batch: int) -> None:
    """``x``'s first dimension must equal the mask's batch size."""
    if x.shape[0] != batch:
        raise ValueError(f"{name} has batch size {x.shape[0]}, but mask has {batch}")


def group_index(group_ids: Sequence[Hashable] | torch.Tensor, batch: int,
                device: torch.device) -> tuple[torch.Tensor, int]:
    """Map ``group_ids`` (``B`` hashables or a ``[B]`` integer tensor) to dense ``[B]`` long ids.

    Returns ``(index, num_groups)``, ids numbered in order of first appearance.
    """
    if isinstance(group_ids, torch.Tensor):
        if group_ids.dim() != 1:
            raise ValueError(f"group_ids must have shape [B], got {tuple(group_ids.shape)}")
        if group_ids.is_floating_point() or group_ids.is_complex():
            raise ValueError(
                f"group_ids tensor must be integer or bool, got dtype {group_ids.dtype}"
            )
        if group_ids.shape[0] != batch:
            raise ValueError(
                f"group_ids has {group_ids.shape[0]} entries, but the batch has {batch}"
            )
        unique, index = torch.unique(group_ids, return_inverse=True)
        return index.to(device=device, dtype=torch.long), int(unique.numel())
    if isinstance(group_ids, (str, bytes)) or not isinstance(group_ids, Sequence):
        raise ValueError(
            "group_ids must be a sequence of hashables or a [B] tensor, "
            f"got {type(group_ids).__name__}"
        )
    if len(group_ids) != batch:
        raise ValueError(f"group_ids has {len(group_ids)} entries, but the batch has {batch}")
    ids: dict[Hashable, int] = {}
    try:
        dense = [ids.setdefault(g, len(ids)) for g in group_ids]
    except TypeError as err:
        raise ValueError(f"group_ids must be hashable: {err}") from err
    return torch.tensor(dense, dtype=torch.long, device=device), len(ids)
