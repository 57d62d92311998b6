"""runs/data_parallel"""
