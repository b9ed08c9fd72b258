"""ElevenLabs' text-to-speech API over the service, so the voice-agent frameworks' ElevenLabs
plugins (Pipecat's, LiveKit Agents') work against it unchanged.

``socket``: the input-streaming sockets (stream-input, multi-stream-input), each context one
stream of speech through the native session's piece (``realtime/feed.py``); ``graph``: a socket
in the Ingress (each context admitted as a stream); ``speech``: the HTTP routes' service over the
speech service; ``alignment``: where characters lie in the audio (estimated within segments);
``routes``: the router. Shapes: ``protocol/elevenlabs.py``. Plain Python, no Ray.
"""
