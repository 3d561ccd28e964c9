"""Media parts, decoding, chat messages. Imports nothing else of relax_gym."""

from relax_gym.omni.cache import DecodeCache, default_cache
from relax_gym.omni.chat_json import ConversationFormatError, dumps, from_openai, loads, to_openai
from relax_gym.omni.decode import DecodedAudio, DecodedVideo
from relax_gym.omni.errors import MediaError
from relax_gym.omni.parts import (
    AudioPart,
    ImagePart,
    MediaPart,
    Message,
    Part,
    TextPart,
    VideoPart,
    media_parts,
)
from relax_gym.omni.sampling import AudioSampling, ImageSampling, VideoSampling
from relax_gym.omni.source import MediaSource

__all__ = [
    "AudioPart", "AudioSampling", "ConversationFormatError", "DecodeCache", "DecodedAudio", "DecodedVideo",
    "ImagePart", "ImageSampling", "MediaError", "MediaPart", "MediaSource", "Message", "Part", "TextPart",
    "VideoPart", "VideoSampling", "default_cache", "dumps", "from_openai", "loads", "media_parts", "to_openai",
]
