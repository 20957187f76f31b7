"""grpojob.client: a GRPOJob in mode service, driven from the user's own process (Tinker-style;
docs/service.md). Imports no torch."""
from grpojob.client.service import APIFuture, SamplingClient, ServiceClient, ServiceError, TrainingClient
from grpojob.api.service import (AdamParams, Datum, EncodedTextChunk, ForwardBackwardOutput, LoadStateResponse, ModelInput,
                    OptimStepResponse, SampledSequence, SampleResponse, SamplingParams, SaveStateResponse,
                    SaveWeightsForSamplerResponse, ServiceInfo, TensorData)

__all__ = ["APIFuture", "AdamParams", "Datum", "EncodedTextChunk", "ForwardBackwardOutput", "LoadStateResponse",
           "ModelInput", "OptimStepResponse", "SampleResponse", "SampledSequence", "SamplingClient",
           "SamplingParams", "SaveStateResponse", "SaveWeightsForSamplerResponse", "ServiceClient", "ServiceError",
           "ServiceInfo", "TensorData", "TrainingClient"]
