"""A ChatQnA megaservice on OPEA's orchestrator (`opea-comps`), the reference of the overhead
benchmark. It runs in its own environment (`benchmarks/opea/setup-venv`):

    .cache/opea-venv/bin/python benchmarks/opea/megaservice.py --port 8888 \\
        --upstream http://127.0.0.1:9000 --retriever http://127.0.0.1:9000

The graph is the one OPEA's ChatQnA example serves: EMBEDDING -> RETRIEVER -> RERANK -> LLM,
four remote `MicroService`s run by a `ServiceOrchestrator` behind a megaservice
`MicroService` on `/v1/chatqna`, with OPEA's request and response models, a RAG prompt of the
same shape and OPEA's stream format (`data: b'token'` lines, then `data: [DONE]`). It differs
in two ways, neither of which changes the work per request: the embedder is called on TEI's
OpenAI-compatible `/v1/embeddings` route (the one ChatQnA uses, so one stand-in serves both)
instead of TEI's `/embed`, and the orchestrator's hooks are methods of a subclass rather than
functions assigned onto the library class. uvicorn's access log is turned off after the
service is built, the earliest point OPEA allows, to match the ChatQnA server under test.
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
from collections.abc import Iterable, Iterator
from typing import Any
from urllib.parse import urlsplit

from comps import (
    MegaServiceEndpoint,
    MicroService,
    ServiceOrchestrator,
    ServiceRoleType,
    ServiceType,
)
from comps.cores.mega.utils import handle_message
from comps.cores.proto.api_protocol import (
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatCompletionResponseChoice,
    ChatMessage,
    UsageInfo,
)
from comps.cores.proto.docarray import LLMParams, RerankerParms, RetrieverParms
from fastapi import Request
from fastapi.responses import StreamingResponse

RAG_PROMPT = (
    "### Answer the user's question from the search results of the local knowledge base. "
    "Leave out what is not relevant, and say so if the results do not hold the answer.\n"
    "### Search results: {context}\n"
    "### Question: {question}\n"
    "### Answer:\n"
)


def rag_prompt(question: str, documents: list[str]) -> str:
    return RAG_PROMPT.format(context="\n".join(documents), question=question)


class ChatQnAGraph(ServiceOrchestrator):
    """OPEA's orchestrator with ChatQnA's input, output and stream alignment per node."""

    def __init__(self, llm_model: str) -> None:
        super().__init__()
        self.llm_model = llm_model

    def align_inputs(
        self,
        inputs: dict[str, Any],
        cur_node: str,
        runtime_graph: Any,
        llm_parameters_dict: dict[str, Any],
        **kwargs: Any,
    ) -> dict[str, Any]:
        kind = self.services[cur_node].service_type
        if kind == ServiceType.EMBEDDING:
            return {"input": inputs["text"]}
        if kind == ServiceType.RETRIEVER:
            parameters = kwargs.get("retriever_parameters")
            if parameters is not None:
                inputs.update(parameters.model_dump())
            return inputs
        if kind == ServiceType.LLM:
            return {
                "model": self.llm_model,
                "messages": [{"role": "user", "content": inputs["inputs"]}],
                "max_tokens": llm_parameters_dict["max_tokens"],
                "top_p": llm_parameters_dict["top_p"],
                "temperature": llm_parameters_dict["temperature"],
                "frequency_penalty": llm_parameters_dict["frequency_penalty"],
                "stream": llm_parameters_dict["stream"],
            }
        return inputs

    def align_outputs(
        self,
        data: Any,
        cur_node: str,
        inputs: dict[str, Any],
        runtime_graph: Any,
        llm_parameters_dict: dict[str, Any],
        **kwargs: Any,
    ) -> Any:
        kind = self.services[cur_node].service_type
        if kind == ServiceType.EMBEDDING:
            return {"text": inputs["input"], "embedding": data["data"][0]["embedding"]}
        if kind == ServiceType.RETRIEVER:
            texts = [doc["text"] for doc in data["retrieved_docs"]]
            # OPEA's retriever echoes the query as `initial_query`; the text sent is the same.
            query = data.get("initial_query", inputs["text"])
            return {"query": query, "texts": texts}
        if kind == ServiceType.RERANK:
            parameters = kwargs.get("reranker_parameters")
            top_n = parameters.top_n if parameters is not None else 1
            kept = [inputs["texts"][hit["index"]] for hit in data[:top_n]]
            return {"inputs": rag_prompt(inputs["query"], kept)}
        if kind == ServiceType.LLM and not llm_parameters_dict["stream"]:
            return {"text": data["choices"][0]["message"]["content"]}
        return data

    def align_generator(self, gen: Iterable[bytes], **kwargs: Any) -> Iterator[str]:
        """OpenAI chunks in, OPEA's `data: b'...'` token lines out, then `data: [DONE]`."""
        for chunk in gen:
            for line in chunk.decode("utf-8").splitlines():
                if not line.startswith("data:") or line.endswith("[DONE]"):
                    continue
                choices = json.loads(line[5:]).get("choices") or [{}]
                content = choices[0].get("delta", {}).get("content")
                if content:
                    yield f"data: {content.encode('utf-8')!r}\n\n"
        yield "data: [DONE]\n\n"


class ChatQnAService:
    """The megaservice: the graph above behind `POST /v1/chatqna`."""

    def __init__(self, port: int, upstream: str, retriever: str, llm_model: str) -> None:
        self.port = port
        self.graph = ChatQnAGraph(llm_model)
        nodes = [
            ("embedding", upstream, "/v1/embeddings", ServiceType.EMBEDDING),
            ("retriever", retriever, "/v1/retrieval", ServiceType.RETRIEVER),
            ("rerank", upstream, "/rerank", ServiceType.RERANK),
            ("llm", upstream, "/v1/chat/completions", ServiceType.LLM),
        ]
        services = []
        for name, url, endpoint, kind in nodes:
            parts = urlsplit(url)
            services.append(
                MicroService(
                    name=name,
                    host=parts.hostname,
                    port=parts.port,
                    endpoint=endpoint,
                    use_remote_service=True,
                    service_type=kind,
                )
            )
            self.graph.add(services[-1])
        for before, after in itertools.pairwise(services):
            self.graph.flow_to(before, after)

    async def handle_request(self, request: Request) -> Any:
        data = await request.json()
        stream = bool(data.get("stream", True))
        chat = ChatCompletionRequest.model_validate(data)
        prompt = handle_message(chat.messages)
        llm = LLMParams(
            max_tokens=chat.max_tokens or 1024,
            top_p=chat.top_p or 0.95,
            temperature=chat.temperature if chat.temperature is not None else 0.01,
            frequency_penalty=chat.frequency_penalty or 0.0,
            stream=stream,
        )
        results, runtime_graph = await self.graph.schedule(
            initial_inputs={"text": prompt},
            llm_parameters=llm,
            retriever_parameters=RetrieverParms(k=chat.k or 4),
            reranker_parameters=RerankerParms(top_n=chat.top_n or 1),
        )
        for response in results.values():
            if isinstance(response, StreamingResponse):
                return response
        answer = results[runtime_graph.all_leaves()[-1]]["text"]
        choice = ChatCompletionResponseChoice(
            index=0, message=ChatMessage(role="assistant", content=answer), finish_reason="stop"
        )
        return ChatCompletionResponse(model="chatqna", choices=[choice], usage=UsageInfo())

    def start(self) -> None:
        endpoint = str(MegaServiceEndpoint.CHAT_QNA)
        service = MicroService(
            "ChatQnAService",
            service_role=ServiceRoleType.MEGASERVICE,
            host="127.0.0.1",
            port=self.port,
            endpoint=endpoint,
            input_datatype=ChatCompletionRequest,
            output_datatype=ChatCompletionResponse,
        )
        service.add_route(endpoint, self.handle_request, methods=["POST"])
        # uvicorn writes an access line only while its access logger has handlers.
        access = logging.getLogger("uvicorn.access")
        access.handlers.clear()
        access.propagate = False
        service.start()


def main() -> None:
    parser = argparse.ArgumentParser(description="ChatQnA on OPEA's ServiceOrchestrator")
    parser.add_argument("--port", type=int, default=8888)
    parser.add_argument("--upstream", required=True, help="TEI + OpenAI base URL")
    parser.add_argument("--retriever", required=True, help="OPEA retriever service base URL")
    parser.add_argument("--llm-model", default="standin")
    args = parser.parse_args()
    ChatQnAService(args.port, args.upstream, args.retriever, args.llm_model).start()


if __name__ == "__main__":
    main()
