"""What engines and GPU hosts report, read the same way by the web tier and the GPU-host workers.

Pure code: no Django, no HTTP, no GPU. The workers read live answers with it; the web tier reads
the same answers where they arrive in files (a benchmark result that embeds the server's info).
"""
