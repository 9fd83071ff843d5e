"""Provider clients: RunPod (GraphQL) and Vast.ai (REST) behind one interface."""
