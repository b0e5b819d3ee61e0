// f32 transcendentals with stated accuracy, written out so that every driver computes the same
// values (GLSL's built-in exp / tanh have loose precision requirements in Vulkan, §46.4.1):
// - tp_exp: Cephes expf (range reduction by ln 2 in two parts, degree-6 polynomial), ≤ 2 ulp;
//   2^n is built in two halves so e^x stays finite up to 88.72 and underflows smoothly;
// - tp_tanh: Cephes tanhf (odd polynomial below 0.625, 1 − 2/(e^{2|x|} + 1) above);
// - tp_erf: Eigen's rational approximation on [-4, 4] (Eigen/src/Core/MathFunctionsImpl.h).
// These are the polynomials of native/cpu/vec_avx2.c, so both backends agree to a few ulp.

float tp_exp(float x) {
  if (isnan(x)) return x;
  if (x > 88.72283935546875) return uintBitsToFloat(0x7f800000u);  // +inf
  if (x < -103.97208404541016) return 0.0;
  float n = roundEven(x * 1.44269504088896341);
  float r = x - n * 0.693359375;  // ln 2 split: 0.693359375 has 9 bits, so n · it is exact
  r = r - n * -2.12194440e-4;
  float p = 1.9875691500e-4;
  p = p * r + 1.3981999507e-3;
  p = p * r + 8.3334519073e-3;
  p = p * r + 4.1665795894e-2;
  p = p * r + 1.6666665459e-1;
  p = p * r + 5.0000001201e-1;
  float y = (p * r) * r + r + 1.0;
  int e = int(n);
  int e1 = e / 2;  // 2^n = 2^e1 · 2^(n − e1), each factor a normal f32
  int e2 = e - e1;
  return y * uintBitsToFloat(uint(e1 + 127) << 23) * uintBitsToFloat(uint(e2 + 127) << 23);
}

float tp_sigmoid(float x) { return 1.0 / (1.0 + tp_exp(-x)); }

float tp_tanh(float x) {
  float ax = abs(x);
  if (ax < 0.625) {
    float z = x * x;
    float p = -5.70498872745e-3;
    p = p * z + 2.06390887954e-2;
    p = p * z + -5.37397155531e-2;
    p = p * z + 1.33314422036e-1;
    p = p * z + -3.33332819422e-1;
    return (p * z) * x + x;
  }
  if (isnan(x)) return x;
  float t = 1.0 - 2.0 / (tp_exp(ax + ax) + 1.0);
  return x < 0.0 ? -t : t;
}

float tp_erf(float x) {
  if (isnan(x)) return x;
  x = clamp(x, -4.0, 4.0);
  float x2 = x * x;
  float p = -2.72614225801306e-10;
  p = p * x2 + 2.77068142495902e-08;
  p = p * x2 + -2.10102402082508e-06;
  p = p * x2 + -5.69250639462346e-05;
  p = p * x2 + -7.34990630326855e-04;
  p = p * x2 + -2.95459980854025e-03;
  p = p * x2 + -1.60960333262415e-02;
  p = p * x;
  float q = -1.45660718464996e-05;
  q = q * x2 + -2.13374055278905e-04;
  q = q * x2 + -1.68282697438203e-03;
  q = q * x2 + -7.37332916720468e-03;
  q = q * x2 + -1.42647390514189e-02;
  return p / q;
}
