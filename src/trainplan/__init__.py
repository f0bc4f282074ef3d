"""trainplan: plan, prove and cost a distributed LLM fine-tune."""

__version__ = "0.1.0"
