"""runs/pipeline"""
