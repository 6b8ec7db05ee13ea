#pragma once
// The stream kinds behind open_shard (not API): each in its own file.
#include <spindle/shard_stream.hpp>

namespace spindle::detail {

// A regular file (or memfd) read with pread at the stream's own offset, so a
// descriptor inherited across fork shares no file position. Owns `fd` if
// `owns`; `name` is for messages.
std::unique_ptr<ShardStream> open_file_stream(int fd, bool owns, std::string name);
std::unique_ptr<ShardStream> open_file_stream(const std::string& path, std::string name);

// http:// and https:// (shard_stream_http.cpp).
std::unique_ptr<ShardStream> open_http_stream(const std::string& url, const ShardOptions& options);

// pipe:CMD (shard_stream_pipe.cpp).
std::unique_ptr<ShardStream> open_pipe_stream(const std::string& url, const ShardOptions& options);

// A remote shard through the cache (shard_cache.cpp): the cached file if
// present, else `open` teed into a part file that finish() renames into place.
std::unique_ptr<ShardStream> open_cached(const std::string& url, const ShardOptions& options,
                                         std::unique_ptr<ShardStream> (*open)(const std::string&,
                                                                              const ShardOptions&));

}  // namespace spindle::detail
