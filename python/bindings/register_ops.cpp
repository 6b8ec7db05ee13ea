// spindle::ops, one sample at a time: numpy in, numpy out. Lambdas convert
// types and release the GIL around the C++ call, nothing else.
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <spindle/ops/image_ops.hpp>

#include <cstring>
#include <optional>
#include <stdexcept>
#include <tuple>
#include <variant>

#include "interop/color_args.hpp"
#include "register.hpp"

namespace py = pybind11;

namespace spindle::python {
namespace {

using CropTuple = std::tuple<int, int, int, int>;  // top, left, height, width
using SizeTuple = std::tuple<int, int>;           // height, width
using U8Array = py::array_t<uint8_t, py::array::c_style>;

// Hands the image's own buffer to numpy (no copy); the capsule frees it.
py::array to_array(ops::Image&& img) {
  auto* owner = new ops::Image(std::move(img));
  py::capsule free_when_done(owner, [](void* p) { delete static_cast<ops::Image*>(p); });
  return U8Array({owner->height, owner->width, owner->channels}, owner->pixels.data(), free_when_done);
}

ops::Image from_array(const U8Array& a, const char* fn) {
  if (a.ndim() != 3 || a.shape(0) <= 0 || a.shape(1) <= 0 || a.shape(2) <= 0)
    throw py::value_error(std::string("spindle.ops.") + fn + ": expected a non-empty (H, W, C) uint8 array, got " +
                          std::to_string(a.ndim()) + " dimensions");
  ops::Image img;
  img.height = static_cast<int>(a.shape(0));
  img.width = static_cast<int>(a.shape(1));
  img.channels = static_cast<int>(a.shape(2));
  img.pixels.resize(static_cast<size_t>(a.size()));
  std::memcpy(img.pixels.data(), a.data(), img.pixels.size());
  return img;
}

std::span<const std::byte> bytes_of(const py::buffer_info& info) {
  return {static_cast<const std::byte*>(info.ptr), static_cast<size_t>(info.size * info.itemsize)};
}

// An (H, W, 3) copy of `image` changed in place by fn(pixels).
template <class Fn>
py::array on_rgb_copy(const U8Array& image, const char* name, Fn fn) {
  ops::Image img = from_array(image, name);
  if (img.channels != 3)
    throw py::value_error(std::string("spindle.ops.") + name + ": expected an (H, W, 3) RGB array, got " +
                          std::to_string(img.channels) + " channels");
  {
    py::gil_scoped_release release;
    fn(std::span<uint8_t>(img.pixels));
  }
  return to_array(std::move(img));
}

void register_color_ops(py::module_& m) {
  m.def("adjust_brightness", [](const U8Array& image, double f) {
        return on_rgb_copy(image, "adjust_brightness", [f](std::span<uint8_t> p) { ops::adjust_brightness(p, f); });
      }, py::arg("image"), py::arg("factor"), "torchvision adjust_brightness (tensor formula) of an (H, W, 3) copy.");
  m.def("adjust_contrast", [](const U8Array& image, double f) {
        return on_rgb_copy(image, "adjust_contrast", [f](std::span<uint8_t> p) { ops::adjust_contrast(p, f); });
      }, py::arg("image"), py::arg("factor"), "torchvision adjust_contrast (tensor formula) of an (H, W, 3) copy.");
  m.def("adjust_saturation", [](const U8Array& image, double f) {
        return on_rgb_copy(image, "adjust_saturation", [f](std::span<uint8_t> p) { ops::adjust_saturation(p, f); });
      }, py::arg("image"), py::arg("factor"), "torchvision adjust_saturation (tensor formula) of an (H, W, 3) copy.");
  m.def("adjust_hue", [](const U8Array& image, double f) {
        return on_rgb_copy(image, "adjust_hue", [f](std::span<uint8_t> p) { ops::adjust_hue(p, f); });
      }, py::arg("image"), py::arg("factor"), "torchvision adjust_hue (tensor formula) of an (H, W, 3) copy.");
  m.def("rgb_to_grayscale", [](const U8Array& image) {
        return on_rgb_copy(image, "rgb_to_grayscale", [](std::span<uint8_t> p) { ops::rgb_to_grayscale(p); });
      }, py::arg("image"), "torchvision rgb_to_grayscale(num_output_channels=3) of an (H, W, 3) copy.");
  m.def(
      "color_jitter_draw",
      [](uint64_t seed, uint64_t epoch, uint64_t index, const JitterArg& b, const JitterArg& c, const JitterArg& s,
         const JitterArg& h) {
        ops::Rng rng(seed, epoch, index);
        const ops::ColorJitterDraw d = ops::draw_color_jitter(jitter_of(b, c, s, h), rng);
        return std::make_tuple(std::make_tuple(d.order[0], d.order[1], d.order[2], d.order[3]), d.brightness,
                               d.contrast, d.saturation, d.hue);
      },
      py::arg("seed"), py::arg("epoch"), py::arg("index"), py::arg("brightness") = 0.0, py::arg("contrast") = 0.0,
      py::arg("saturation") = 0.0, py::arg("hue") = 0.0,
      "ColorJitter.get_params from (seed, epoch, index): (order, brightness, contrast, saturation, hue).");
  m.def(
      "color_jitter",
      [](const U8Array& image, uint64_t seed, uint64_t epoch, uint64_t index, const JitterArg& b, const JitterArg& c,
         const JitterArg& s, const JitterArg& h) {
        const ops::ColorJitter j = jitter_of(b, c, s, h);
        return on_rgb_copy(image, "color_jitter", [&](std::span<uint8_t> p) {
          ops::Rng rng(seed, epoch, index);
          ops::apply_color_jitter(p, ops::draw_color_jitter(j, rng));
        });
      },
      py::arg("image"), py::arg("seed"), py::arg("epoch"), py::arg("index"), py::arg("brightness") = 0.0,
      py::arg("contrast") = 0.0, py::arg("saturation") = 0.0, py::arg("hue") = 0.0,
      "ColorJitter of an (H, W, 3) copy, its draw from (seed, epoch, index).");
  m.def(
      "random_grayscale",
      [](const U8Array& image, double p, uint64_t seed, uint64_t epoch, uint64_t index) {
        bool done = false;
        py::array out = on_rgb_copy(image, "random_grayscale", [&](std::span<uint8_t> px) {
          ops::Rng rng(seed, epoch, index);
          done = ops::random_grayscale(px, p, rng);
        });
        return std::make_tuple(out, done);
      },
      py::arg("image"), py::arg("p"), py::arg("seed"), py::arg("epoch"), py::arg("index"),
      "RandomGrayscale(p) of an (H, W, 3) copy, its draw from (seed, epoch, index): (image, whether it was applied).");
}

}  // namespace

void register_ops(py::module_& m) {
  register_color_ops(m);
  m.def(
      "decode_image",
      [](const py::buffer& data, std::optional<CropTuple> crop, std::optional<SizeTuple> size) {
        py::buffer_info info = data.request();
        std::optional<ops::CropBox> box;
        if (crop) box = ops::CropBox{std::get<0>(*crop), std::get<1>(*crop), std::get<2>(*crop), std::get<3>(*crop)};
        std::optional<ops::Size> sz;
        if (size) sz = ops::Size{std::get<0>(*size), std::get<1>(*size)};
        ops::Image img;
        {
          py::gil_scoped_release release;
          ops::decode(bytes_of(info), box, sz, img);
        }
        return to_array(std::move(img));
      },
      py::arg("data"), py::arg("crop") = py::none(), py::arg("size") = py::none(),
      "Decodes a JPEG, PNG, WebP, TIFF, BMP or binary PPM/PGM (crop (top, left, h, w), zero-padded where it "
      "leaves the image, then resize to (h, w)) to an (H, W, 3) uint8 array.");
  m.def(
      "image_info",
      [](const py::buffer& data) {
        py::buffer_info info = data.request();
        ops::ImageInfo i;
        {
          py::gil_scoped_release release;
          i = ops::probe(bytes_of(info));
        }
        static constexpr const char* kNames[] = {"jpeg", "png", "webp", "tiff", "bmp", "pnm"};
        return std::make_tuple(i.height, i.width, i.channels, std::string(kNames[static_cast<int>(i.format)]));
      },
      py::arg("data"), "(height, width, channels, format) from the headers only.");
  m.def(
      "random_resized_crop_box",
      [](int height, int width, uint64_t seed, uint64_t epoch, uint64_t index, std::pair<double, double> scale,
         std::pair<double, double> ratio) {
        ops::Rng rng(seed, epoch, index);
        const ops::CropBox b = ops::random_resized_crop_box(height, width, rng, scale, ratio);
        return std::make_tuple(b.top, b.left, b.height, b.width);
      },
      py::arg("height"), py::arg("width"), py::arg("seed"), py::arg("epoch"), py::arg("index"),
      py::arg("scale") = std::pair<double, double>{0.08, 1.0},
      py::arg("ratio") = std::pair<double, double>{3.0 / 4, 4.0 / 3},
      "torchvision RandomResizedCrop's box (top, left, h, w), drawn from (seed, epoch, index).");
  m.def(
      "center_crop_box",
      [](int height, int width, SizeTuple size) {
        const ops::CropBox b = ops::center_crop_box(height, width, {std::get<0>(size), std::get<1>(size)});
        return std::make_tuple(b.top, b.left, b.height, b.width);
      },
      py::arg("height"), py::arg("width"), py::arg("size"), "CenterCrop's box (top, left, h, w); it leaves an image smaller than the crop, as "
      "torchvision's pad-then-crop does.");
  m.def(
      "resize",
      [](const U8Array& image, SizeTuple size) {
        ops::Image in = from_array(image, "resize"), out;
        {
          py::gil_scoped_release release;
          ops::resize(in, {std::get<0>(size), std::get<1>(size)}, out);
        }
        return to_array(std::move(out));
      },
      py::arg("image"), py::arg("size"), "PIL-equal antialiased bilinear resize of an (H, W, C) uint8 array.");
  m.def(
      "hflip",
      [](const U8Array& image) {
        ops::Image img = from_array(image, "hflip");
        {
          py::gil_scoped_release release;
          ops::hflip(img);
        }
        return to_array(std::move(img));
      },
      py::arg("image"), "A left-right mirrored copy of an (H, W, C) uint8 array.");
  m.def(
      "normalize",
      [](const U8Array& image, std::vector<float> mean, std::vector<float> std, bool chw) {
        ops::Image img = from_array(image, "normalize");
        std::vector<ssize_t> shape = chw ? std::vector<ssize_t>{img.channels, img.height, img.width}
                                         : std::vector<ssize_t>{img.height, img.width, img.channels};
        py::array_t<float> out(shape);
        std::span<float> dst(out.mutable_data(), static_cast<size_t>(out.size()));
        {
          py::gil_scoped_release release;
          ops::normalize(img, mean, std, chw, dst);
        }
        return out;
      },
      py::arg("image"), py::arg("mean"), py::arg("std"), py::arg("chw") = false,
      "(x / 255 - mean) / std as float32, (H, W, C) or with chw (C, H, W).");
}

}  // namespace spindle::python
