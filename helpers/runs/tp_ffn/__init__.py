"""runs/tp_ffn"""
