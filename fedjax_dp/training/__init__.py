"""What clients and server compute: local training, the server's stages and optimizer."""
