"""runs/tp_llama"""
