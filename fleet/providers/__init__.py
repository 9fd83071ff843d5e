"""The providers: RunPod (GraphQL) and Vast.ai (REST) behind one interface (`base`), built from
the environment by `factory`; the Hugging Face Hub store (`store`); their listings matched
against the registry (`sync`)."""
