"""runs/placement"""
