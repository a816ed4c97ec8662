"""The draft-depth tuner: an acceptance model, a cost model and the policies that use them."""

from .acceptance import PRIOR_SHRINK, AcceptanceModel
from .costs import CostModel
from .policy import EXPLOIT_REACH, AutoDepth, DepthPolicy, FixedDepth

__all__ = ["EXPLOIT_REACH", "PRIOR_SHRINK", "AcceptanceModel", "AutoDepth", "CostModel", "DepthPolicy",
           "FixedDepth"]
