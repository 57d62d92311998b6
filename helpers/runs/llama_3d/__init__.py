"""runs/llama_3d"""
